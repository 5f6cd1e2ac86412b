"""The hot path: one request forwarded to an engine replica and its answer relayed back.

The client's side is a ``server.downstream.Downstream``, injected by the protocol that serves
the request (server.front's lean one, server.uvicorn_adapter's for uvicorn's cycle) through the
scope's disconnect hook, else plain ASGI: the relay knows nothing of the HTTP server. Where
the downstream offers a direct writer (server.front's lean path, uvicorn's httptools cycle) a
token event costs one upstream read, a few byte tests (server.sse) and one write to the
client's socket, all in the engine connection's read callback (``_Stream.sink``): no task
wake-up, no future, no ASGI message per token. Whatever that path cannot do exactly as
``Downstream.write`` would (client socket paused or gone, another server, the end of a
stream) goes through the request's task.

Control flow: the request's own task does the exchange; the client's disconnect comes from the
downstream as a callback, and a single lazily re-armed timer enforces the first-byte and idle
timeouts. Either cancels the request task with a recorded reason, and closing the upstream
response (not returning the connection to the pool) is what makes vLLM abort the request.

What differs between the API dialects (OpenAI chat/completions, Responses, Anthropic
messages: a stream's framing and terminal event, usage, error shapes) is the request's
``server.dialects.Dialect``'s.

A non-streamed answer is buffered and checked (JSON, usage: one parse, in a thread when large)
up to ``BUFFER_MAX_BYTES``; a longer one is relayed as it arrives, with back-pressure, its usage
read from its end: memory per request stays bounded whatever the engine sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from server.admission import Admission
from server.asgi import AsgiDownstream, Receive, Send
from server.config import ProxyConfig
from server.dialects import Dialect, StreamRules, dialect_for
from server.downstream import ChunkWriter, Downstream
from server.enginestatus import EngineStatus
from server.errors import (
    SHUTDOWN_MESSAGE,
    ProxyError,
    TooManyRequests,
    UpstreamBadResponse,
    UpstreamTimeout,
    UpstreamUnavailable,
    error_body,
)
from server.metrics import ProxyMetrics, RouteMetrics
from server.router import Router, Upstream
from server.sse import usage_of_object, usage_of_tail
from server.upstream import (
    BadResponse,
    ConnectFailed,
    ConnectionBroken,
    Connector,
    Pool,
    Response,
    reuse_window,
    tcp_connect,
)
from topocommon import jsontext

log = logging.getLogger("toposerve.access")
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"content-length", b"date",
    b"server", b"x-request-id",
})
_LOCATIONS = frozenset({b"location", b"content-location"})
CLIENT_GONE = 499
FINAL_SEND_TIMEOUT_S = 5.0
# Non-streamed answers up to this are buffered, checked and sent with one write; longer ones
# are relayed as they arrive (their JSON is not checked, their usage is read from their end).
BUFFER_MAX_BYTES = 1 << 20
THREAD_PARSE_BYTES = 64 * 1024  # a buffered answer from this size on is parsed in a thread
USAGE_TAIL_BYTES = 16 * 1024
# The server cancelled the request task (its drain timeout ran out at shutdown): the stream
# ends with an error event in its dialect, and the access log says 503.


@dataclass
class Call:
    """One request on its way through; ``status`` and ``upstream`` are filled in as it goes."""

    request_id: str
    method: str
    target: str
    route: str
    model: str
    headers: list[tuple[str, str]]
    body: bytes
    inspect: bool = False
    strip_usage: bool = False
    affinity: bytes | None = None
    wanted_model: str | None = None  # the body's "model", for replicas serving different ones
    t_start: float = field(default_factory=time.perf_counter)
    status: int = 0
    upstream: str = "-"
    started: bool = False
    finished: bool = False  # the client's response is complete: nothing more may be sent
    disconnect_hook: dict[str, Any] | None = None  # see DISCONNECT_HOOK
    dialect: Dialect = field(init=False)

    def __post_init__(self) -> None:
        self.dialect = dialect_for(self.target)


class _Guard:
    """Turns a client disconnect or a timeout into a cancellation of the request task.

    A timeout is the engine's only while the client is reading: once the client's socket is
    paused, the proxy stops reading the engine (back-pressure) and the silence is the
    client's. The guard then waits ``max(idle, stall)`` longer for the server's stall timer
    (server.front.StallTimer) to cut the client off; a client still paused after that (a server
    without one) is ended here as a stall. Only the timer's expiry looks at this: no per-token
    work."""

    def __init__(self, task: asyncio.Task[Any], cfg: ProxyConfig,
                 client_paused: Callable[[], bool]) -> None:
        self.task = task
        self.cfg = cfg
        self.client_paused = client_paused
        self.loop = task.get_loop()
        self.reason: str | None = None
        self.active = True
        self.streaming = False
        self.held = False  # a timeout was put off once already because the client was paused
        self.last = self.loop.time()
        self.timer = self.loop.call_at(self.last + cfg.first_byte_timeout_s, self._expire)

    def fire(self, reason: str) -> None:
        if self.active and self.reason is None:
            self.reason = reason
            self.task.cancel()

    def client_left(self) -> None:
        self.fire("client")

    def touch(self) -> None:
        self.last = self.loop.time()
        if not self.streaming:
            self.streaming = True
            self.timer.cancel()
            self.timer = self.loop.call_at(self.last + self.cfg.idle_timeout_s, self._expire)

    def _expire(self) -> None:
        now = self.loop.time()
        if self.streaming:
            due = self.last + self.cfg.idle_timeout_s
            if now < due:  # data came since this timer was set: look again when the new
                self.held = False  # silence would end
                self.timer = self.loop.call_at(due, self._expire)
                return
        if self.client_paused():
            if self.held:
                self.fire("stall")
                return
            self.held = True
            self.last = now  # the engine could not be heard while the client held it back
            wait = max(self.cfg.idle_timeout_s, self.cfg.client_stall_timeout_s)
            self.timer = self.loop.call_at(now + wait, self._expire)
            return
        self.fire("idle" if self.streaming else "first_byte")

    def stop(self) -> None:
        self.active = False
        self.timer.cancel()


class Relay:
    def __init__(self, cfg: ProxyConfig, router: Router, metrics: ProxyMetrics,
                 admission: Admission, connect: Connector = tcp_connect) -> None:
        self.cfg = cfg
        self.router = router
        self.metrics = metrics
        self.admission = admission
        self.pools = {url: Pool(url, cfg.connect_timeout_s, cfg.upstream_api_key, connect,
                                reuse_window(cfg.upstream_keep_alive_s))
                      for url in cfg.upstreams}
        self.engine_status = EngineStatus(cfg.engine_status_file)

    def unavailable(self) -> UpstreamUnavailable:
        """The 503 for no engine answering: the launcher's reason where it wrote one."""
        return self.engine_status.error() or UpstreamUnavailable(
            "no engine is answering (it is starting, restarting or down); retry after the "
            "Retry-After delay")

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()

    # -- one request -----------------------------------------------------------------------

    async def handle(self, call: Call, receive: Receive, send: Send) -> None:
        # The protocol that serves the request put its downstream in the hook (server.front,
        # server.uvicorn_adapter); under any other ASGI server, plain ASGI.
        hook = call.disconnect_hook
        down = hook.get("downstream") if hook is not None else None
        await self.relay(call, down if down is not None else AsgiDownstream(receive, send, hook))

    async def relay(self, call: Call, down: Downstream) -> None:
        task = asyncio.current_task()
        assert task is not None
        guard = _Guard(task, self.cfg, down.paused)
        down.on_disconnect(guard.client_left)
        route_metrics = self.metrics.route(call.model, call.route)
        in_flight = route_metrics.in_flight
        in_flight.inc()
        try:
            await self._admitted(call, guard, down)
        except ProxyError as exc:
            guard.stop()
            await self._fail(call, exc, down)
        except asyncio.CancelledError:
            guard.stop()
            if guard.reason is None:  # the server's: shutdown past its drain timeout
                # The client is told, and the request ends there: uvicorn no longer waits for
                # it, and a re-raised cancellation would only be logged as an 'Exception in
                # ASGI application' with a traceback, one per request cut.
                await self._shutdown(call, task, down)
                return
            task.uncancel()
            await self._cancelled(call, guard.reason, down)
        except Exception as exc:  # a bug of the proxy: still an error answer, never a hang
            guard.stop()
            logging.getLogger("toposerve").error("internal error relaying %s: %s: %s",
                                                 call.request_id, type(exc).__name__, exc)
            with contextlib.suppress(Exception):
                await self._fail(call, ProxyError("internal error in the proxy; see its log"),
                                 down)
        finally:
            guard.stop()
            down.close()
            in_flight.dec()
            self._record(call, route_metrics)

    async def _admitted(self, call: Call, guard: _Guard, down: Downstream) -> None:
        if not await self.admission.acquire():
            raise TooManyRequests(
                f"too many requests in flight ({self.admission.limit}) and the queue is full; "
                "retry after the Retry-After delay")
        try:
            await self._exchange(call, guard, down)
        finally:
            self.admission.release()

    async def _exchange(self, call: Call, guard: _Guard, down: Downstream) -> None:
        tried: list[Upstream] = []
        while True:
            up = self.router.pick(call.affinity, tried, call.wanted_model)
            if up is None:
                raise self.unavailable()
            call.upstream = up.url
            up.outstanding += 1
            try:
                resp = await self._send_upstream(call, up)
                if resp is None:
                    tried.append(up)
                    continue
                try:
                    await self._relay(call, up, resp, guard, down)
                finally:
                    resp.finish()  # closed unless read to the end: the engine sees the abort
                return
            finally:
                up.outstanding -= 1

    async def _send_upstream(self, call: Call, up: Upstream) -> Response | None:
        """The engine's response, or None when it could not be reached (try another)."""
        try:
            return await self.pools[up.url].request(call.method, call.target, call.headers,
                                                    call.body)
        except ConnectFailed:
            self.metrics.upstream_errors.labels(up.url, "connect").inc()
            up.up = False
            self.metrics.upstream_up.labels(up.url).set(0)
            return None
        except BadResponse as exc:
            self.metrics.upstream_errors.labels(up.url, "malformed").inc()
            raise UpstreamBadResponse(f"{exc}; the request was not relayed") from None
        except (ConnectionBroken, OSError):
            self.metrics.upstream_errors.labels(up.url, "stream_broken").inc()
            # the launcher's reason first: a group it stops closes the connections it held
            raise self.engine_status.error() or UpstreamUnavailable(
                "the engine closed the connection before answering; retry after the "
                "Retry-After delay") from None

    async def _relay(self, call: Call, up: Upstream, resp: Response,
                     guard: _Guard, down: Downstream) -> None:
        if resp.status >= 500:
            self.metrics.upstream_errors.labels(up.url, "status_5xx").inc()
        engine = self.pools[up.url].netloc.encode("latin-1")
        headers = [(k, proxied_location(v, engine) if k in _LOCATIONS else v)
                   for k, v in resp.headers if k not in HOP_BY_HOP]
        headers.append((b"x-request-id", call.request_id.encode()))
        if resp.content_type == b"text/event-stream":
            await self._relay_stream(call, up, resp, headers, guard, down)
        else:
            await self._relay_body(call, up, resp, headers, guard, down)

    def _too_large(self, up: Upstream) -> UpstreamBadResponse:
        self.metrics.upstream_errors.labels(up.url, "too_large").inc()
        return UpstreamBadResponse(
            "the engine's answer exceeded --max-response-bytes "
            f"({self.pools[up.url].max_response_bytes} bytes); start the proxy with a larger "
            "--max-response-bytes to accept it, or ask for a shorter answer")

    async def _relay_body(self, call: Call, up: Upstream, resp: Response,
                          headers: list[tuple[bytes, bytes]], guard: _Guard,
                          down: Downstream) -> None:
        limit = self.pools[up.url].max_response_bytes
        declared = resp.content_length
        if declared is not None and declared > limit:
            raise self._too_large(up)
        chunks: list[bytes] = []
        size = 0
        reading = resp.iter_chunks()
        try:
            async for chunk in reading:
                guard.touch()
                chunks.append(chunk)
                size += len(chunk)
                if size > BUFFER_MAX_BYTES:
                    break
            else:  # whole, and short: checked, then sent in one write
                if size > limit:
                    raise self._too_large(up)
                body = b"".join(chunks)
                if call.inspect and resp.status == 200:
                    await self._check_body(call, up, body)
                # an answer to HEAD says the length a GET's body would have, and has none
                length = declared if call.method == "HEAD" and declared is not None else len(body)
                headers.append((b"content-length", str(length).encode()))
                call.status = resp.status
                call.started = True
                await down.start(resp.status, headers)
                await down.end(body)
                return
        except ConnectionBroken:
            self.metrics.upstream_errors.labels(up.url, "stream_broken").inc()
            raise UpstreamBadResponse("the engine broke off its answer; retry the request"
                                      ) from None
        if size > limit:
            raise self._too_large(up)
        await self._relay_long_body(call, up, resp, headers, guard, down,
                                    (b"".join(chunks), reading, size, limit))

    async def _relay_long_body(self, call: Call, up: Upstream, resp: Response,
                               headers: list[tuple[bytes, bytes]], guard: _Guard,
                               down: Downstream, read: tuple[bytes, Any, int, int]) -> None:
        """Relayed as it arrives; broken off (or over the limit) after the start, the client's
        connection is cut: a body with a length, or chunked without its last chunk, that ends
        early is what HTTP has to say a response is incomplete."""
        first, reading, size, limit = read
        if resp.content_length is not None:
            headers.append((b"content-length", str(resp.content_length).encode()))
        call.status = resp.status
        call.started = True
        await down.start(resp.status, headers)
        tail = first[-USAGE_TAIL_BYTES:]
        await down.write(first)
        try:
            async for chunk in reading:
                guard.touch()
                size += len(chunk)
                if size > limit:
                    self._too_large(up)
                    call.status = 502
                    down.abort()
                    return
                tail = (tail + chunk)[-USAGE_TAIL_BYTES:]
                await down.write(chunk)
        except ConnectionBroken:
            self.metrics.upstream_errors.labels(up.url, "stream_broken").inc()
            call.status = 502
            down.abort()
            return
        call.finished = True
        await down.end()
        if call.inspect and resp.status == 200:
            self._count_usage(call, usage_of_tail(tail))

    async def _check_body(self, call: Call, up: Upstream, body: bytes) -> None:
        """One parse of a buffered answer (in a thread when large, as request bodies are):
        malformed JSON is a 502, the usage is counted."""
        try:
            obj = (await asyncio.to_thread(jsontext.loads, body)
                   if len(body) >= THREAD_PARSE_BYTES else jsontext.loads(body))
        except ValueError:
            self.metrics.upstream_errors.labels(up.url, "malformed").inc()
            raise UpstreamBadResponse("the engine answered with malformed JSON") from None
        self._count_usage(call, usage_of_object(obj))

    async def _relay_stream(self, call: Call, up: Upstream, resp: Response,
                            headers: list[tuple[bytes, bytes]], guard: _Guard,
                            down: Downstream) -> None:
        call.status = resp.status
        call.started = True
        await down.start(resp.status, headers)
        stream = _Stream(self, call, guard, resp, down)
        try:
            while True:
                if stream.ending is not None:  # found by the sink, in the read callback
                    forward, outcome = stream.ending
                    if stream.failure is not None:
                        raise stream.failure
                elif resp.chunks:
                    forward, outcome = stream.process(resp.take())
                elif resp.complete:
                    missing = stream.rules.missing_end()
                    if missing is not None:
                        await self._broken(call, up, "stream_broken", "the engine ended the "
                                           f"stream without {missing}; retry the request", down,
                                           stream)
                    else:
                        await down.end()
                    return
                elif resp.broken:
                    raise ConnectionBroken("the engine broke off its answer")
                else:
                    await resp.wait()
                    continue
                if outcome == _MORE:
                    if forward:
                        stream.busy = True  # chunks arriving meanwhile queue behind this one
                        try:
                            await down.write(forward)
                        finally:
                            stream.busy = False
                    continue
                if outcome == _MALFORMED:
                    if forward:
                        await down.write(forward)
                    await self._broken(call, up, "malformed", "the engine sent a malformed event",
                                       down, stream)
                    return
                # [DONE] ends the client's response in the same send; the engine's closing
                # chunk is read after, so the connection can be pooled.
                call.finished = True
                await down.end(forward)
                # The client has its whole answer: its leaving now (it may close as soon as it
                # reads the last chunk) is no abort, and must neither cut the read below nor
                # turn the request's 200 into a 499.
                guard.stop()
                break
            if not resp.complete:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):  # else finish() closes the connection
                        async for _ in resp.iter_chunks():
                            pass
        except ConnectionBroken:
            if not stream.rules.done:
                await self._broken(call, up, "stream_broken",
                                   "the engine broke off the stream; retry the request", down,
                                   stream)
        finally:
            resp.sink = None

    async def _broken(self, call: Call, up: Upstream, kind: str, message: str,
                      down: Downstream, stream: _Stream) -> None:
        self.metrics.upstream_errors.labels(up.url, kind).inc()
        call.status = 502 if kind == "malformed" else 503
        # Events held back for the usage chunk that never came go to the client first.
        held = stream.rules.release()
        await _bounded(down.end(held + _stream_error(call, message, kind)))

    def _count_usage(self, call: Call, usage: tuple[int, int] | None) -> None:
        if usage is not None:
            self.metrics.count_usage(call.model, usage[0], usage[1])

    # -- endings ------------------------------------------------------------------------------

    async def _cancelled(self, call: Call, reason: str, down: Downstream) -> None:
        if reason == "client":
            call.status = CLIENT_GONE
            return
        if reason == "stall":  # the client took nothing for a whole timeout and more
            self.metrics.client_stalls.inc()
            log.info("%s: the client took nothing while the engine waited: given up",
                     call.request_id)
            call.status = CLIENT_GONE
            return
        if call.finished:
            return
        up = call.upstream
        self.metrics.upstream_errors.labels(up, "timeout").inc()
        what = ("the engine sent nothing for " f"{self.cfg.idle_timeout_s:g} s" if reason == "idle"
                else f"the engine did not answer within {self.cfg.first_byte_timeout_s:g} s")
        if call.started:
            call.status = 504
            await _bounded(down.end(_stream_error(call, f"{what}; retry the request",
                                                  "timeout")))
            return
        await self._fail(call, UpstreamTimeout(f"{what}; retry the request"), down)

    async def _shutdown(self, call: Call, task: asyncio.Task[Any], down: Downstream) -> None:
        """Cut by the server at shutdown: the client is told (an error event, or a 503), and
        the access log says so."""
        if call.finished:
            return
        task.uncancel()  # for the bounded send below
        await self._fail(call, UpstreamUnavailable(SHUTDOWN_MESSAGE), down, bound_s=1.0)

    async def _fail(self, call: Call, exc: ProxyError, down: Downstream,
                    bound_s: float = FINAL_SEND_TIMEOUT_S) -> None:
        if call.finished:
            return
        call.status = exc.status
        if call.started:
            await _bounded(down.end(_stream_error(call, exc.message, exc.code or "error")),
                           bound_s)
            return
        body = call.dialect.error_body(exc, call.request_id)
        await _bounded(_send_error(down, exc, json.dumps(body).encode(), call.request_id),
                       bound_s)

    def _record(self, call: Call, route_metrics: RouteMetrics) -> None:
        elapsed = time.perf_counter() - call.t_start
        route_metrics.count(call.status)
        if call.status == 200:
            route_metrics.e2e.observe(elapsed)
        log.info("%s %s %s %d %.1fms upstream=%s", call.request_id, call.method, call.route,
                 call.status, elapsed * 1000, call.upstream)


_MORE, _DONE, _MALFORMED = 0, 1, 2


class _Stream:
    """One relayed event stream: what every chunk goes through, on either of two paths.

    The fast path is ``sink``, called by the upstream connection in its read callback: the
    chunk is inspected and written straight to the client's socket, so a token event costs no
    task wake-up, future or coroutine resumption. It declines (and the chunk is queued for the
    request task, which sends it through ASGI ``send``) whenever that would not be exactly what
    ``send`` does: no direct writer, the client's socket paused or gone, or the task itself in
    the middle of a send (order). The end of a stream ([DONE], a malformed event) is always left
    to the task, which may need to await.
    """

    __slots__ = ("busy", "call", "ending", "failure", "guard", "relay", "resp", "rules",
                 "timing", "writer")

    def __init__(self, relay: Relay, call: Call, guard: _Guard, resp: Response,
                 down: Downstream) -> None:
        self.relay = relay
        self.call = call
        self.guard = guard
        self.resp = resp
        # framing, terminal event and usage: the dialect's (server.dialects)
        self.rules: StreamRules = call.dialect.stream_rules(call.inspect, call.strip_usage)
        self.timing = _Timing(relay.metrics.route(call.model, call.route), call)
        self.busy = False
        self.ending: tuple[bytes, int] | None = None
        self.failure: Exception | None = None
        self.writer: ChunkWriter | None = down.direct()
        if self.writer is not None:
            resp.sink = self.sink

    def process(self, data: bytes) -> tuple[bytes, int]:
        """What to forward of ``data`` and whether the stream goes on; records the metrics."""
        self.guard.touch()
        rules = self.rules
        scan = rules.feed(data)
        if scan.tokens:
            self.timing.tokens(scan.tokens)
        if scan.usage is not None:
            self.relay._count_usage(self.call, scan.usage)
        if scan.malformed:
            return scan.forward, _MALFORMED
        return scan.forward, (_DONE if rules.done else _MORE)

    def sink(self, data: bytes) -> bool:
        writer = self.writer
        if self.busy or writer is None or not writer.ready():
            return False
        guard = self.guard
        if guard.streaming and self.rules.plain_token(data):
            # The per-token case, inlined: what process() and _Timing.tokens(1) do for it,
            # minus the Scan and a call.
            guard.last = guard.loop.time()
            timing = self.timing
            now = time.perf_counter()
            if timing.last is None:
                timing.ttft.observe(now - self.call.t_start)
            else:
                timing.itl.observe(now - timing.last)
            timing.last = now
            writer.write(data)
            return True
        try:
            forward, outcome = self.process(data)
        except Exception as exc:  # a bug of the proxy: raised in the task, not in the parser
            self.failure = exc
            outcome, forward = _MALFORMED, b""
        if outcome == _MORE and self.failure is None:
            if forward:
                writer.write(forward)
            return True
        self.ending = (forward, outcome)
        self.resp.sink = None
        self.resp._wake()
        return True


class _Timing:
    """TTFT and inter-token gaps of one stream, observed as token events pass."""

    __slots__ = ("call", "itl", "last", "ttft")

    def __init__(self, route_metrics: RouteMetrics, call: Call) -> None:
        self.call = call
        self.ttft = route_metrics.ttft
        self.itl = route_metrics.itl
        self.last: float | None = None

    def tokens(self, n: int) -> None:
        if not n:
            return
        now = time.perf_counter()
        if self.last is None:
            self.ttft.observe(now - self.call.t_start)
        else:
            self.itl.observe(now - self.last)
        for _ in range(n - 1):  # events that arrived in the same read: no gap between them
            self.itl.observe(0.0)
        self.last = now


async def _bounded(sending: Awaitable[None], bound_s: float = FINAL_SEND_TIMEOUT_S) -> None:
    """Send the last words of a failed request, but not forever: a client that stopped
    reading would hold the request's task; returning lets uvicorn close the connection."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(bound_s):
            await sending


def proxied_location(value: bytes, engine: bytes) -> bytes:
    """A ``Location`` the engine built from the Host the proxy sent it (FastAPI's redirect of
    a path with a trailing slash: ``http://127.0.0.1:8001/v1/chat/completions``), made the path
    alone, which the client resolves against the proxy's own URL (as nginx's ``proxy_redirect
    default``): the engine's address stays inside, and a client that follows the redirect
    comes back through the proxy instead of going round it. Any other value is unchanged, and
    so is one whose path a browser could read as another host's (``//x``, ``/\\x``, a tab or
    space in it: the WHATWG URL parser drops tabs and takes a backslash for a slash)."""
    text = value.strip()
    # https: the engine's uvicorn trusts X-Forwarded-Proto from the proxy's address, so a
    # client that sends one gets its redirects built with that scheme
    for prefix in (b"http://" + engine, b"https://" + engine, b"//" + engine):
        if text[:len(prefix)].lower() == prefix.lower():
            rest = text[len(prefix):]
            if rest[:1] not in (b"", b"/", b"?", b"#") or _UNSAFE_PATH.search(rest):
                return value
            rest = rest if rest[:1] == b"/" else b"/" + rest
            return value if rest[:2] == b"//" else rest
    return value


_UNSAFE_PATH = re.compile(rb"[\x00-\x20\\\x7f]")


def _stream_error(call: Call, message: str, code: str) -> bytes:
    """The events that end a broken stream, in the route's dialect."""
    return call.dialect.stream_error(message, code)


async def _send_error(down: Downstream, exc: ProxyError, body: bytes, request_id: str) -> None:
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()),
               (b"x-request-id", request_id.encode()), *exc.headers()]
    await down.start(exc.status, headers)
    await down.end(body)


async def send_error(send: Send, exc: ProxyError, request_id: str) -> None:
    """An OpenAI-format error answer through ASGI ``send`` (the generation routes' checks)."""
    body = json.dumps(error_body(exc.message, exc.type, exc.code, exc.param)).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()),
               (b"x-request-id", request_id.encode()), *exc.headers()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
