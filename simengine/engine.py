"""A simulated OpenAI/vLLM engine with exact, drift-free timings, for benchmarks and fault tests.

    python -m simengine --host 127.0.0.1 --port 8100 --ttft 0.05 --itl 0.02 [--model NAME]

Timeline of a generation: the request is complete at t0 (the loop's monotonic clock, when the
last body byte was parsed); streamed response headers go out at once; token k (k = 0..n-1) is
written at exactly ``t0 + ttft + k * itl`` — an absolute deadline, so lateness never accumulates.
Chat streams send the role chunk together with token 0, the last token's chunk carries
``finish_reason``, then the usage chunk (only with ``stream_options.include_usage``) and
``data: [DONE]``. A non-streamed answer is written when its last token would be
(``t0 + ttft + (n-1) * itl``). n = ``max_tokens`` (or ``max_completion_tokens``; default
``--default-max-tokens``); with ``--eos-after E`` a request without ``ignore_eos`` stops at
``max(E, min_tokens)`` tokens with finish_reason "stop". Prompt tokens: see simengine.tokens.

Routes: /v1/models, /v1/completions, /v1/chat/completions, /v1/messages, /v1/responses
(shapes of each: simengine.shapes), /tokenize, /health, /metrics
(vllm:num_requests_running, vllm:num_requests_waiting, vllm:prompt_tokens_total,
vllm:generation_tokens_total), /version, and for tests /sim/stats (GET), /sim/reset (POST),
/sim/control (POST JSON: fault, healthy, health_delay, refuse (true or seconds), ttft,
itl, hold, let_go).
``hold: true`` holds every generation before its first token (headers not sent yet), as vLLM's
/pause does, until ``hold: false`` lets them all go, each from that instant (``t0`` then; its
``ttft`` counts from there): a test holds requests in flight for exactly as long as it needs
them there, instead of giving them a ttft long enough for a loaded machine. ``let_go: true``
lets the held ones go the same way and keeps holding those that come after (a client's
requests answered group by group: no moment without the hold between two groups).
Faults: see simengine.faults.

It is a raw asyncio protocol with httptools, one timer callback per token and pre-rendered byte
templates, so that 256 streams stay on time on two shared cores. The default event loop is the
standard one: its clock is time.monotonic() and its timers fire within ~1 ms after the deadline,
whereas uvloop's clock and timers have 1 ms granularity (``--loop uvloop`` is there to compare).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import heapq
import itertools
import json
import math
import os
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from typing import Any, cast

import httptools

from simengine.faults import NO_FAULT, Fault, FaultSpecError, parse_fault
from simengine.shapes import ROUTES, Answer, Templates
from simengine.tokens import PromptError, messages_token_ids, prompt_token_ids

READY_PREFIX = "simengine listening on "


@dataclass(frozen=True)
class SimConfig:
    host: str = "127.0.0.1"
    port: int = 0
    ttft: float = 0.05
    itl: float = 0.02
    model: str = "sim-model"
    max_model_len: int = 32768
    default_max_tokens: int = 16
    eos_after: int | None = None
    fault: Fault = NO_FAULT
    accept_delay: float = 0.0
    max_body_bytes: int = 64 * 1024 * 1024
    loop: str = "asyncio"
    spaced_json: bool = False  # JSON as Python writes it by default, not vLLM's compact form
    fingerprint: str | None = None  # system_fingerprint, placed where vLLM places it


@dataclass
class SimStats:
    """Counters a test reads through /sim/stats to check what the engine really saw."""

    requests: int = 0
    generations: int = 0
    running: int = 0
    completed: int = 0
    aborted: int = 0
    killed: int = 0
    stalled: int = 0
    faults: int = 0
    connections: int = 0
    open_connections: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    late_max_s: float = 0.0
    late_sum_s: float = 0.0
    by_route: dict[str, int] = field(default_factory=dict)
    last_headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


@dataclass
class _Plan:
    """What one generation will send: its answer's shape and sizes, and its fault."""

    answer: Answer
    stream: bool
    fault: Fault

    @property
    def chat(self) -> bool:
        return self.answer.kind == "chat"

    @property
    def n_tokens(self) -> int:
        return self.answer.n_tokens

    @property
    def prompt_tokens(self) -> int:
        return self.answer.prompt_tokens


class SimEngine:
    """Shared state of one simulated engine; ``protocol_factory`` is what asyncio serves."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.stats = SimStats()
        self.fault = cfg.fault
        self.healthy = True
        self.health_delay = 0.0  # seconds /health takes to answer (a busy engine)
        self.refuse_until = 0.0  # loop time until which new connections are reset
        self.ttft = cfg.ttft
        self.itl = cfg.itl
        self.ticker = _Ticker()
        self.holding = False
        self.held: list[_Generation] = []

    def hold(self, on: bool) -> None:
        """Hold generations before their first token (``on``), or let every held one go now."""
        self.holding = on
        if not on:
            self.let_go()

    def let_go(self) -> None:
        """Let every held generation go now; a hold that is on stays on for those after."""
        held, self.held = self.held, []
        now = asyncio.get_running_loop().time()
        for generation in held:
            generation.release(now)

    def protocol_factory(self) -> _Connection:
        return _Connection(self)

    # -- routing -----------------------------------------------------------------------------

    def handle(self, conn: _Connection, req: _Request) -> None:
        route = req.path.split("?", 1)[0]
        self.stats.requests += 1
        self.stats.by_route[route] = self.stats.by_route.get(route, 0) + 1
        if route.startswith("/v1/"):  # the headers a proxy forwarded, for tests to read
            self.stats.last_headers = dict(req.headers)
        handler = _ROUTES.get((req.method, route))
        if handler is None:
            known = any(path == route for _, path in _ROUTES)
            status = 405 if known else 404
            conn.send_json(status, {"detail": HTTPStatus(status).phrase})
            return
        handler(self, conn, req)

    def fault_for(self, req: _Request) -> Fault:
        spec = req.headers.get("x-sim-fault")
        return parse_fault(spec) if spec is not None else self.fault


class _Ticker:
    """All deadlines of all generations in one heap of tuples, driven by one loop timer.

    A TimerHandle per token costs a Python-level ``__lt__`` per heap step; plain tuples compare
    in C and every token due in one loop iteration runs from a single callback.
    """

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Callable[[float], None]]] = []
        self.seq = itertools.count()
        self.handle: asyncio.TimerHandle | None = None
        self.armed_for = math.inf
        self.firing = False

    def at(self, when: float, callback: Callable[[float], None]) -> None:
        heapq.heappush(self.heap, (when, next(self.seq), callback))
        # While firing, the one timer is set once at the end: arming here as well would leave
        # a second live timer behind each time, and those multiply.
        if not self.firing and when < self.armed_for:
            self._arm(when)

    def _arm(self, when: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.armed_for = when
        self.handle = asyncio.get_running_loop().call_at(when, self._fire)

    def _fire(self) -> None:
        loop = asyncio.get_running_loop()
        self.handle, self.armed_for = None, math.inf
        heap = self.heap
        now = loop.time()
        self.firing = True
        try:
            # asyncio fires a timer up to its clock resolution early; allow that much.
            while heap and heap[0][0] <= now + 1e-6:
                _, _, callback = heapq.heappop(heap)
                callback(now)
                now = loop.time()
        finally:
            self.firing = False
        if heap:
            self._arm(heap[0][0])


def _error(conn: _Connection, status: int, message: str, headers: Sequence[str] = ()) -> None:
    err_type = "BadRequestError" if status < 500 else "InternalServerError"
    if status == 404:
        err_type = "NotFoundError"
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    conn.send_json(status, body, headers)


def _json_body(conn: _Connection, req: _Request) -> dict[str, Any] | None:
    try:
        body = json.loads(req.body)
    except (ValueError, UnicodeDecodeError) as exc:
        _error(conn, 400, f"request body is not valid JSON: {exc}")
        return None
    if not isinstance(body, dict):
        _error(conn, 400, "request body must be a JSON object")
        return None
    return body


def _health(eng: SimEngine, conn: _Connection, req: _Request) -> None:
    def answer(_now: float) -> None:
        conn.send_bytes(200 if eng.healthy else 503, "application/json", b"")

    if eng.health_delay:
        eng.ticker.at(asyncio.get_running_loop().time() + eng.health_delay, answer)
    else:
        answer(0.0)


def _version(eng: SimEngine, conn: _Connection, req: _Request) -> None:
    conn.send_json(200, {"version": "simengine"})


def _models(eng: SimEngine, conn: _Connection, req: _Request) -> None:
    card = {
        "id": eng.cfg.model, "object": "model", "created": int(time.time()),
        "owned_by": "vllm", "root": eng.cfg.model, "parent": None,
        "max_model_len": eng.cfg.max_model_len, "permission": [],
    }
    conn.send_json(200, {"object": "list", "data": [card]})


def _tokenize(eng: SimEngine, conn: _Connection, req: _Request) -> None:
    body = _json_body(conn, req)
    if body is None:
        return
    try:
        if "messages" in body:
            ids = messages_token_ids(body["messages"])
        else:
            ids = prompt_token_ids(body.get("prompt", ""))
    except PromptError as exc:
        _error(conn, 400, str(exc))
        return
    reply = {"count": len(ids), "max_model_len": eng.cfg.max_model_len, "tokens": ids,
             "token_strs": None}
    conn.send_json(200, reply)


def _stats(eng: SimEngine, conn: _Connection, req: _Request) -> None:
    conn.send_json(200, asdict(eng.stats))


def _reset(eng: SimEngine, conn: _Connection, req: _Request) -> None:
    running, open_conns = eng.stats.running, eng.stats.open_connections
    eng.stats = SimStats(running=running, open_connections=open_conns)
    conn.send_json(200, {"ok": True})


def _control(eng: SimEngine, conn: _Connection, req: _Request) -> None:
    body = _json_body(conn, req)
    if body is None:
        return
    try:
        if "fault" in body:
            eng.fault = parse_fault(str(body["fault"] or ""))
        eng.healthy = bool(body.get("healthy", eng.healthy))
        eng.health_delay = float(body.get("health_delay", eng.health_delay))
        refuse = body.get("refuse")
        if refuse is not None:
            # true: refuse from now on (over HTTP it cannot be undone); a number: for so many s
            duration = math.inf if refuse is True else float(refuse or 0)
            eng.refuse_until = asyncio.get_running_loop().time() + duration
        eng.ttft = float(body.get("ttft", eng.ttft))
        eng.itl = float(body.get("itl", eng.itl))
        if "hold" in body:
            eng.hold(bool(body["hold"]))
        if body.get("let_go") is True:
            eng.let_go()
    except (FaultSpecError, TypeError, ValueError) as exc:
        _error(conn, 400, str(exc))
        return
    conn.send_json(200, {"ok": True})


def _metrics(eng: SimEngine, conn: _Connection, req: _Request) -> None:
    conn.send_bytes(200, "text/plain; version=0.0.4; charset=utf-8",
                    render_metrics(eng.cfg.model, eng.stats).encode())


def render_metrics(model: str, stats: SimStats) -> str:
    """The vLLM metrics the simulated engine keeps, in Prometheus text format."""
    labels = f'{{engine="0",model_name={json.dumps(model)}}}'
    rows = [
        ("vllm:num_requests_running", "gauge", stats.running),
        ("vllm:num_requests_waiting", "gauge", 0),
        ("vllm:prompt_tokens_total", "counter", stats.prompt_tokens),
        ("vllm:generation_tokens_total", "counter", stats.generation_tokens),
    ]
    lines = []
    for name, kind, value in rows:
        lines += [f"# HELP {name} {name} (simulated engine)", f"# TYPE {name} {kind}",
                  f"{name}{labels} {float(value)}"]
    return "\n".join(lines) + "\n"


def _generate(eng: SimEngine, conn: _Connection, req: _Request, kind: str) -> None:
    body = _json_body(conn, req)
    if body is None:
        return
    try:
        fault = eng.fault_for(req)
        plan = plan_generation(eng.cfg, body, kind, fault)
    except (FaultSpecError, PromptError) as exc:
        _error(conn, 400, str(exc))
        return
    except LookupError as exc:
        _error(conn, 404, str(exc.args[0]))
        return
    if fault.active:
        eng.stats.faults += 1
    if fault.close:
        conn.transport_close()
        return
    if fault.status is not None:
        extra = [f"retry-after: {fault.retry_after}"] if fault.retry_after is not None else []
        _error(conn, fault.status, f"simulated fault: status {fault.status}", extra)
        return
    _Generation(eng, conn, plan).start()


def plan_generation(cfg: SimConfig, body: dict[str, Any], kind: str, fault: Fault) -> _Plan:
    """Decide sizes from the request; raises PromptError (400) or LookupError (404).

    ``kind``: a value of shapes.ROUTES ("chat", "completion", "messages", "responses")."""
    model = body.get("model")
    if model is not None and model != cfg.model:
        raise LookupError(f"The model `{model}` does not exist.")
    if kind == "completion":
        ids = prompt_token_ids(body.get("prompt", ""))
    elif kind == "responses":
        given = body.get("input", "")
        ids = prompt_token_ids(given) if isinstance(given, str) else messages_token_ids(given)
    else:
        ids = messages_token_ids(body.get("messages"))
    max_tokens = body.get("max_completion_tokens") if kind == "chat" else None
    if kind == "responses":
        max_tokens = body.get("max_output_tokens")
    max_tokens = max_tokens if max_tokens is not None else body.get("max_tokens")
    max_tokens = cfg.default_max_tokens if max_tokens is None else max_tokens
    if not _is_count(max_tokens) or max_tokens < 1:
        raise PromptError("max_tokens must be a positive integer")
    if len(ids) + max_tokens > cfg.max_model_len:
        raise PromptError(
            f"This model's maximum context length is {cfg.max_model_len} tokens. However, you "
            f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.")
    if body.get("n", 1) not in (1, None):
        raise PromptError("the simulated engine supports n=1 only")
    n, finish = _token_count(cfg, body, max_tokens)
    options = body.get("stream_options")
    if not isinstance(options, dict):
        options = {}
    include_usage = bool(options.get("include_usage"))
    # As vLLM: continuous usage only together with include_usage.
    continuous = include_usage and bool(options.get("continuous_usage_stats"))
    answer = Answer(kind=kind, model=cfg.model, n_tokens=n, prompt_tokens=len(ids),
                    finish_reason=finish, include_usage=include_usage,
                    continuous_usage=continuous, spaced=cfg.spaced_json,
                    fingerprint=cfg.fingerprint)
    return _Plan(answer=answer, stream=bool(body.get("stream")), fault=fault)


def _token_count(cfg: SimConfig, body: dict[str, Any], max_tokens: int) -> tuple[int, str]:
    min_tokens = body.get("min_tokens") or 0
    if not _is_count(min_tokens):
        raise PromptError("min_tokens must be a non-negative integer")
    if cfg.eos_after is None or body.get("ignore_eos"):
        return max_tokens, "length"
    n = min(max_tokens, max(cfg.eos_after, min_tokens))
    return n, "length" if n == max_tokens else "stop"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_ROUTES: dict[tuple[str, str], Callable[[SimEngine, _Connection, _Request], None]] = {
    ("GET", "/health"): _health,
    ("GET", "/version"): _version,
    ("GET", "/v1/models"): _models,
    ("POST", "/tokenize"): _tokenize,
    ("GET", "/metrics"): _metrics,
    ("GET", "/sim/stats"): _stats,
    ("POST", "/sim/reset"): _reset,
    ("POST", "/sim/control"): _control,
    **{("POST", path): functools.partial(_generate, kind=kind) for path, kind in ROUTES.items()},
}


GARBAGE = b'data: {"id": "broken\x00\xff not json\n\nevent without data\n\n'


class _Generation:
    """One request's timed output; each token is a plain loop callback at an absolute time."""

    def __init__(self, eng: SimEngine, conn: _Connection, plan: _Plan) -> None:
        self.eng, self.conn, self.plan = eng, conn, plan
        self.tpl = Templates(plan.answer)
        self.sent = 0
        self.first = 0.0
        self.t0 = 0.0
        self.done = False

    def start(self) -> None:
        stats = self.eng.stats
        stats.generations += 1
        stats.running += 1
        stats.prompt_tokens += self.plan.prompt_tokens
        self.conn.generation = self
        t0 = self.conn.t_request
        if self.plan.fault.header_delay:
            t0 += self.plan.fault.header_delay
        self.t0 = t0
        if t0 > self.conn.t_request:
            self.eng.ticker.at(t0, self._begin)
        else:
            self._begin(t0)

    def _begin(self, now: float) -> None:
        if self.done:
            return
        if self.eng.holding:
            self.eng.held.append(self)
            return
        self._go()

    def _go(self) -> None:
        self.first = self.t0 + self.eng.ttft
        self.itl = self.eng.itl
        if self.plan.stream:
            self.conn.send_head(200, "text/event-stream; charset=utf-8", None)
            self.eng.ticker.at(self.first, self._tick)
        else:
            self.eng.ticker.at(self._last_time(), self._answer)

    def release(self, now: float) -> None:
        """Let a held generation go: its first token ``ttft`` after ``now``."""
        if self.done:
            return
        self.t0 = now
        self._go()

    def _last_time(self) -> float:
        fault = self.plan.fault
        stop = self.plan.n_tokens - 1
        for limit in (fault.kill_after, fault.stall_after):
            if limit is not None:
                stop = min(stop, limit)
        return self.first + stop * self.itl

    def _tick(self, now: float) -> None:
        if self.done:
            return
        plan, fault = self.plan, self.plan.fault
        k = self.sent
        # How late this write is against its deadline: lets a test tell engine lateness
        # from client-side measurement error.
        late = now - (self.first + k * self.itl)
        stats = self.eng.stats
        stats.late_sum_s += late
        if late > stats.late_max_s:
            stats.late_max_s = late
        if fault.kill_after is not None and k >= fault.kill_after:
            self._kill()
            return
        if fault.stall_after is not None and k >= fault.stall_after:
            self.eng.stats.stalled += 1
            return
        if fault.garbage_after is not None and k >= fault.garbage_after:
            self.conn.send_chunk(GARBAGE)
            self._finish().end_chunks()
            return
        if fault.end_after is not None and k >= fault.end_after:
            self._finish().end_chunks()
            return
        last = k == plan.n_tokens - 1
        data = self.tpl.last(k) if last else self.tpl.token(k)
        if k == 0:
            data = self.tpl.first + data
        self.conn.send_chunk(data)
        self.sent = k + 1
        stats.generation_tokens += 1
        if last:
            self._finish().end_chunks()
        else:
            self.eng.ticker.at(self.first + self.sent * self.itl, self._tick)

    def _answer(self, now: float) -> None:
        if self.done:
            return
        fault = self.plan.fault
        if fault.kill_after is not None and fault.kill_after < self.plan.n_tokens:
            self._kill()
            return
        if fault.stall_after is not None and fault.stall_after < self.plan.n_tokens:
            self.eng.stats.stalled += 1
            return
        self.eng.stats.generation_tokens += self.plan.n_tokens
        self.sent = self.plan.n_tokens
        body = GARBAGE if fault.garbage_after is not None else self.tpl.full()
        conn = self._finish()
        conn.send_bytes(200, "application/json", body)

    def _kill(self) -> None:
        self.done = True
        self.eng.stats.running -= 1
        self.eng.stats.killed += 1
        self.conn.generation = None
        self.conn.transport_abort()

    def _finish(self) -> _Connection:
        # Detach before the last write: ending the response may start the next pipelined one.
        self.done = True
        self.eng.stats.running -= 1
        self.eng.stats.completed += 1
        self.conn.generation = None
        return self.conn

    def abort(self) -> None:
        """The client went away before the end: stop and count it, like vLLM's abort."""
        if self.done:
            return
        self.done = True  # its pending deadline, if any, is skipped when it comes up
        self.eng.stats.running -= 1
        self.eng.stats.aborted += 1


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection; pipelined requests are answered in order."""

    def __init__(self, eng: SimEngine) -> None:
        self.eng = eng
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.pending: deque[_Request] = deque()
        self.busy = False
        self.generation: _Generation | None = None
        self.t_request = 0.0
        self.counted = False
        self._reset_message()

    def _reset_message(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.body_size = 0
        self.keep_alive = True

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if asyncio.get_running_loop().time() < self.eng.refuse_until:
            self.transport.abort()
            return
        self.eng.stats.connections += 1
        self.eng.stats.open_connections += 1
        self.counted = True
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.eng.cfg.accept_delay:
            self.transport.pause_reading()
            asyncio.get_running_loop().call_later(self.eng.cfg.accept_delay, self._resume)

    def _resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.counted:
            self.eng.stats.open_connections -= 1
            self.counted = False
        if self.generation is not None:
            self.generation.abort()
            self.generation = None
        self.pending.clear()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._bad_request("protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._bad_request(f"malformed HTTP request: {exc}")

    def _bad_request(self, message: str) -> None:
        self.keep_alive = False
        _error(self, 400, message)
        self.transport_close()

    # -- httptools callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reset_message()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size <= self.eng.cfg.max_body_bytes:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.body_size > self.eng.cfg.max_body_bytes:
            self._bad_request_status(413, "request body too large")
            return
        req = _Request(
            method=self.parser.get_method().decode("latin-1"),
            path=self.url.decode("latin-1"),
            headers=self.headers,
            body=b"".join(self.body),
            keep_alive=self.parser.should_keep_alive(),
        )
        self.pending.append(req)
        if not self.busy:
            self._next()

    def _bad_request_status(self, status: int, message: str) -> None:
        self.keep_alive = False
        _error(self, status, message)
        self.transport_close()

    def _next(self) -> None:
        if not self.pending or self.transport is None:
            self.busy = False
            return
        self.busy = True
        req = self.pending.popleft()
        self.keep_alive = req.keep_alive
        self.t_request = asyncio.get_running_loop().time()
        self.eng.handle(self, req)

    # -- writing -------------------------------------------------------------------------------

    def send_head(self, status: int, content_type: str, length: int | None,
                  extra: Sequence[str] = ()) -> None:
        lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
                 f"content-type: {content_type}", "server: simengine"]
        lines.append("transfer-encoding: chunked" if length is None else
                     f"content-length: {length}")
        if not self.keep_alive:
            lines.append("connection: close")
        lines.extend(extra)
        self._write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def send_bytes(self, status: int, content_type: str, body: bytes,
                   extra: Sequence[str] = ()) -> None:
        self.send_head(status, content_type, len(body), extra)
        self._write(body)
        self._response_done()

    def send_json(self, status: int, obj: Any, extra: Sequence[str] = ()) -> None:
        self.send_bytes(status, "application/json", json.dumps(obj).encode(), extra)

    def send_chunk(self, data: bytes) -> None:
        self._write(b"%x\r\n%b\r\n" % (len(data), data))

    def end_chunks(self) -> None:
        self._write(b"0\r\n\r\n")
        self._response_done()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _response_done(self) -> None:
        if not self.keep_alive:
            self.transport_close()
            return
        self._next()

    def transport_close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def transport_abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


# -- serving -----------------------------------------------------------------------------------


def build_app(cfg: SimConfig) -> SimEngine:
    """The engine state and protocol factory, to serve with ``loop.create_server``."""
    return SimEngine(cfg)


async def serve(cfg: SimConfig, ready: Callable[[str], None] | None = None) -> None:
    """Serve until cancelled; ``ready`` gets the base URL once the socket listens."""
    engine = build_app(cfg)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(engine.protocol_factory, cfg.host, cfg.port,
                                      backlog=4096, reuse_address=True)
    port = server.sockets[0].getsockname()[1]
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    (ready or _print_ready)(f"http://{host}:{port}")
    async with server:
        await server.serve_forever()


def _print_ready(url: str) -> None:
    print(READY_PREFIX + url, flush=True)


def run(cfg: SimConfig) -> None:
    """Blocking entry point: serve on the configured event loop until interrupted."""
    if cfg.loop == "uvloop":
        import uvloop

        uvloop.run(serve(cfg))
    else:
        asyncio.run(serve(cfg))


@contextmanager
def spawn(cfg: SimConfig, timeout: float = 20.0) -> Iterator[str]:
    """Run a simulated engine in a child process (its own core time and GIL); yields its URL."""
    with spawn_process(cfg, timeout) as (url, _):
        yield url


@contextmanager
def spawn_process(cfg: SimConfig,
                  timeout: float = 20.0) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Like spawn, also yielding the process (for tests that kill the engine)."""
    argv = [sys.executable, "-m", "simengine", *config_to_argv(cfg)]
    # The child finds this package wherever the caller's working directory is (a benchmark run
    # from another folder, an install that does not list simengine).
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path})
    try:
        yield _await_ready(proc, timeout), proc
    finally:
        stop_process(proc, 5)
        if proc.stdout is not None:
            proc.stdout.close()


def stop_process(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; returns once the process is reaped (the test
    and benchmark helpers that start a server all end it this way)."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _await_ready(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(READY_PREFIX):
            return line[len(READY_PREFIX):].strip()
        if not line and proc.poll() is not None:
            break
    raise RuntimeError(f"simengine did not start (exit code {proc.poll()}); run "
                       f"`{' '.join(proc.args if isinstance(proc.args, list) else [])}` to see why")


def config_to_argv(cfg: SimConfig) -> list[str]:
    argv = ["--host", cfg.host, "--port", str(cfg.port), "--ttft", repr(cfg.ttft),
            "--itl", repr(cfg.itl), "--model", cfg.model, "--max-model-len",
            str(cfg.max_model_len), "--default-max-tokens", str(cfg.default_max_tokens),
            "--accept-delay", repr(cfg.accept_delay), "--loop", cfg.loop]
    if cfg.eos_after is not None:
        argv += ["--eos-after", str(cfg.eos_after)]
    if cfg.fault.active:
        argv += ["--fault", fault_to_spec(cfg.fault)]
    if cfg.spaced_json:
        argv.append("--spaced-json")
    if cfg.fingerprint is not None:
        argv += ["--fingerprint", cfg.fingerprint]
    return argv


def fault_to_spec(fault: Fault) -> str:
    items = []
    for key, value in asdict(fault).items():
        if value is None or value is False or (value == 0.0 and key == "header_delay"):
            continue
        name = key.replace("_", "-")
        items.append(name if value is True else f"{name}={value}")
    return ",".join(items)


def parse_args(argv: Sequence[str] | None = None) -> SimConfig:
    p = argparse.ArgumentParser(prog="python -m simengine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100, help="0 picks a free port (printed)")
    p.add_argument("--ttft", type=float, default=0.05, help="seconds to the first token")
    p.add_argument("--itl", type=float, default=0.02, help="seconds between tokens")
    p.add_argument("--model", default="sim-model")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument("--eos-after", type=int, default=None,
                   help="stop after this many tokens unless ignore_eos (default: never)")
    p.add_argument("--fault", default="", help="fault spec for every request (simengine.faults)")
    p.add_argument("--accept-delay", type=float, default=0.0,
                   help="seconds a new connection waits before its request is read")
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    p.add_argument("--spaced-json", action="store_true",
                   help='write JSON as Python does by default ("a": 1), not compact as vLLM')
    p.add_argument("--fingerprint", default=None,
                   help="system_fingerprint to send (where vLLM puts it)")
    a = p.parse_args(argv)
    try:
        fault = parse_fault(a.fault)
    except FaultSpecError as exc:
        p.error(str(exc))
    return SimConfig(host=a.host, port=a.port, ttft=a.ttft, itl=a.itl, model=a.model,
                     max_model_len=a.max_model_len, default_max_tokens=a.default_max_tokens,
                     eos_after=a.eos_after, fault=fault, accept_delay=a.accept_delay,
                     loop=a.loop, spaced_json=a.spaced_json, fingerprint=a.fingerprint)


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args(argv)
    try:
        run(cfg)
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        sys.exit(f"simengine: cannot listen on {cfg.host}:{cfg.port}: {exc.strerror}; "
                 "pick another --port (0 picks a free one)")


if __name__ == "__main__":
    main()
