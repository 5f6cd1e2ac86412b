"""The CPU engine's own costs, timed on this machine through the path loadgen measures.

Below a few hundred million parameters neither a decode step nor a short prefill is arithmetic:
a decode step is the engine's host work (scheduling, preparing inputs, launching a layer's
operations, sampling) plus the OpenAI server's per token (the hop from the engine core to the API
server, detokenizing, one SSE event), and a prompt's time to first token is a request's fixed
cost (HTTP, scheduling, the first event) plus a per-token rate. All of it follows the machine
(its cores, its clock, what else runs): a constant fitted on one machine was off by 2.6x on the
same machine a day later. This timed vLLM's offline ``LLM`` before: its step came within 2% of
the served one when both were timed in the same minutes, but it timed no prefill, and it needed an
engine of its own, so a test could not time the engine it served from.

So `launcher probe --measure` starts the engine as `serve` does (vLLM's OpenAI server on the
embedded tiny model, :mod:`launcher.pipeline.enginesteps`) and :func:`time_served` times it as
loadgen does: streamed completions of token-id prompts, every body piece stamped as it arrives;
the decode step is (last token - first token) / (completion tokens - 1), the prefill a line
through the time to first token of a short and a long prompt, and attention over a cached
context: the long prompt's new tokens sent again after DEPTH_CONTEXT tokens that are already in
the prefix cache (a coding agent's turn), against the same count alone in the same round;
medians of ROUNDS rounds. The planner then takes the engine's overheads from it: the measured
step less what the roofline gives the tiny model's own forward pass, the prefill's per-token
rate as this CPU's rate, and the deeper prompt's extra time as attention per (query, key) pair.

Pure parts (the record, its JSON and cache key, the stream's timing) need nothing; the timing
talks HTTP to an engine that is already up (serve's, or the one the pipeline starts for it).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from launcher.probe.kernels import write_cache_json

FORMAT = 3  # 1 was the offline engine's step, without the server's per-token work
# 2: without the timing at depth; still read (the plan then says attention was not timed)
READ_FORMATS = (2, FORMAT)
# Tokens per timed generation and rounds: enough gaps that one late event moves the mean little,
# few enough that a round takes about a second on two busy cores.
STEPS = 128
ROUNDS = 7
# The two prompts the prefill line goes through: a request's fixed cost, and loadgen's default
# prompt, whose request then times the decode steps at loadgen's default context (a 1024-token
# prompt's steps were 15% slower here than loadgen's at 512).
SHORT_PROMPT = 16
LONG_PROMPT = 512
# The cached context the depth timing puts before LONG_PROMPT new tokens: a few thousand tokens,
# as an agent's turns reach early on, and whole blocks of the CPU engine's 128 tokens, so that
# all of it is cached and the deeper request computes only the new tokens. Sent once, unmeasured,
# before the rounds (its own prefill is ~3 s on two cores); each round then adds ~1 s: the new
# tokens' prefill (~0.7 s) and their attention over the context (~0.3 s at ~300 ns a pair).
DEPTH_CONTEXT = 2048
REQUEST_TIMEOUT_S = 120.0


class EngineStepError(ValueError):
    """A step measurement that failed or a saved one that cannot be read (one line)."""


@dataclass(frozen=True)
class StepKey:
    device: str  # "cpu: AMD EPYC 7B13 (2 threads)", "NVIDIA H200"
    vllm: str
    torch: str

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class EngineStep:
    key: StepKey
    step_s: float  # median decode step of the measured model, one stream
    steps_s: tuple[float, ...]  # every round's step, for the spread
    # the measured model's size, so the planner can take its own forward pass out of the step
    model_params: int
    model_weight_bytes: int
    measured_at: str
    # time to first token = prefill_fixed_s + prompt tokens x prefill_token_s (medians); None
    # in a record made without them (the planner then assumes its prefill)
    prefill_fixed_s: float | None = None
    prefill_token_s: float | None = None
    # attention over a cached context (format 3): LONG_PROMPT new tokens after ``depth_tokens``
    # cached ones took ``depth_extra_s`` more than the same count alone (median of the rounds'
    # paired differences); ``depth_cached_tokens`` of the context came from the prefix cache,
    # as the server's usage said. None: not timed (a format-2 record, or a server that does not
    # report cached tokens)
    depth_tokens: int | None = None
    depth_new_tokens: int | None = None
    depth_cached_tokens: int | None = None
    depth_extra_s: float | None = None

    @property
    def spread(self) -> float:
        """Slowest round over fastest: how steady the machine was while it was measured."""
        return max(self.steps_s) / min(self.steps_s) if self.steps_s else 1.0


# ------------------------------------------------------------------------------------- JSON
def to_json(rec: EngineStep) -> dict[str, Any]:
    return {"version": FORMAT, **asdict(rec)}


def _num(raw: Any, what: str, hi: float) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise EngineStepError(f"{what} is not a number: {str(raw)[:40]!r}")
    value = float(raw)
    if not math.isfinite(value) or not 0 < value < hi:
        raise EngineStepError(f"{what} is out of range: {value!r}")
    return value


def _text(raw: Any, what: str) -> str:
    if not isinstance(raw, str):
        raise EngineStepError(f"{what} is not text")
    return raw[:200]


def from_json(raw: Any) -> EngineStep:
    """A saved measurement; :class:`EngineStepError` (one line) for anything unreadable."""
    if not isinstance(raw, dict):
        raise EngineStepError("an engine step record is not a JSON object")
    version = raw.get("version")
    if isinstance(version, bool) or version not in READ_FORMATS:
        raise EngineStepError(f"engine step record version {str(version)[:20]!r} is not one of "
                              f"{', '.join(map(str, READ_FORMATS))} (`launcher probe --measure` "
                              "times the engine again)")
    k = raw.get("key")
    if not isinstance(k, dict):
        raise EngineStepError("the engine step record has no key object")
    key = StepKey(*(_text(k.get(f), f) for f in ("device", "vllm", "torch")))
    steps = raw.get("steps_s")
    if not isinstance(steps, list) or not steps or len(steps) > 1000:
        raise EngineStepError("steps_s is not a non-empty list")
    fixed, per_token = raw.get("prefill_fixed_s"), raw.get("prefill_token_s")
    depth = _depth(raw) if version >= 3 else (None, None, None, None)
    return EngineStep(
        key,
        _num(raw.get("step_s"), "step_s", 60.0),
        tuple(_num(s, "a round's step", 60.0) for s in steps),
        int(_num(raw.get("model_params"), "model_params", 1e13)),
        int(_num(raw.get("model_weight_bytes"), "model_weight_bytes", 1e14)),
        _text(raw.get("measured_at"), "measured_at"),
        None if fixed is None else _num(fixed, "prefill_fixed_s", 60.0),
        None if per_token is None else _num(per_token, "prefill_token_s", 1.0),
        *depth,
    )


def _count(raw: Any, what: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= 10**8:
        raise EngineStepError(f"{what} is not a token count: {str(raw)[:40]!r}")
    return raw


def _depth(raw: dict[str, Any]) -> tuple[int | None, int | None, int | None, float | None]:
    """The timing at depth: all four fields, or none (not timed)."""
    names = ("depth_tokens", "depth_new_tokens", "depth_cached_tokens", "depth_extra_s")
    given = [raw.get(n) for n in names]
    if all(v is None for v in given):
        return None, None, None, None
    if any(v is None for v in given):
        raise EngineStepError("the timing at depth is incomplete: "
                              + ", ".join(n for n, v in zip(names, given, strict=True)
                                          if v is None) + " missing")
    depth, new, cached = (_count(v, n) for v, n in zip(given[:3], names[:3], strict=True))
    if cached > depth:
        raise EngineStepError(f"depth_cached_tokens {cached} is more than the context {depth}")
    extra = given[3]
    if isinstance(extra, bool) or not isinstance(extra, (int, float)) or \
            not math.isfinite(extra) or not -60.0 < extra < 60.0:
        raise EngineStepError(f"depth_extra_s is not a number of seconds: {str(extra)[:40]!r}")
    return depth, new, cached, float(extra)


def cache_path(cache_dir: Path, key: StepKey) -> Path:
    return cache_dir / "engine-step" / f"{key.digest()}.json"


def save(cache_dir: Path, rec: EngineStep) -> Path | None:
    """Keep the measurement where a later plan finds it; None when the cache is not writable."""
    return write_cache_json(cache_path(cache_dir, rec.key), to_json(rec))


def load(cache_dir: Path, key: StepKey) -> EngineStep | None:
    """The kept measurement for ``key``; None when there is none or it cannot be read."""
    try:
        rec = from_json(json.loads(cache_path(cache_dir, key).read_text()))
    except (OSError, ValueError, RecursionError):
        return None
    return rec if rec.key == key else None




# ---------------------------------------------------------------------------------- timing
@dataclass(frozen=True)
class Served:
    """An engine that serves the embedded model: its root URL, served name and key headers."""

    url: str
    model: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Streamed:
    """One streamed completion as loadgen reads it: when it was sent, when each event that
    carried tokens arrived, and the completion tokens the server's usage reports."""

    sent: float
    token_times: tuple[float, ...]
    completion_tokens: int | None
    # usage.prompt_tokens_details.cached_tokens: the prompt's tokens found in the prefix cache
    # (None: the server does not say; vLLM with --enable-prompt-tokens-details does)
    cached_tokens: int | None = None

    @property
    def ttft_s(self) -> float:
        return self.token_times[0] - self.sent

    @property
    def step_s(self) -> float:
        """loadgen's decode, as a step: (last token - first token) / (completion tokens - 1)."""
        tokens = self.completion_tokens or len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / max(1, tokens - 1)


def read_stream(sent: float, pieces: Iterable[tuple[float, bytes]]) -> Streamed:
    """The token events of an SSE body given as (arrival time, bytes) pieces; an event is
    stamped with the piece that completed it. Events that are not JSON are skipped."""
    times: list[float] = []
    tokens: int | None = None
    cached: int | None = None
    buffer = b""
    for t, piece in pieces:
        buffer += piece
        *events, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                try:
                    body = json.loads(line[5:])
                except ValueError:
                    continue
                if not isinstance(body, dict):
                    continue
                if isinstance(body.get("choices"), list) and body["choices"]:
                    times.append(t)
                usage = body.get("usage")
                if not isinstance(usage, dict):
                    continue
                if isinstance(usage.get("completion_tokens"), int):
                    tokens = usage["completion_tokens"]
                details = usage.get("prompt_tokens_details")
                if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                    cached = details["cached_tokens"]
    return Streamed(sent, tuple(times), tokens, cached)


def prefill_line(short_s: float, long_s: float, short: int = SHORT_PROMPT,
                 long: int = LONG_PROMPT) -> tuple[float, float]:
    """(fixed, per token): the line through the time to first token of two prompt lengths. A
    long prompt no slower than the short one (noise) is a fixed cost with no per-token part."""
    per_token = max(1e-9, (long_s - short_s) / (long - short))
    return max(1e-6, short_s - short * per_token), per_token


def _stream(client: httpx.Client, served: Served, ids: list[int], gen: int) -> Streamed:
    body = {"model": served.model, "prompt": ids, "max_tokens": gen, "min_tokens": gen,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    pieces: list[tuple[float, bytes]] = []
    sent = time.perf_counter()
    with client.stream("POST", f"{served.url}/v1/completions", json=body,
                       headers=dict(served.headers)) as resp:
        if resp.status_code != 200:
            resp.read()
            raise EngineStepError(f"the engine answered HTTP {resp.status_code} to a timed "
                                  f"request: {resp.text[:200]!r}")
        for piece in resp.iter_raw():
            pieces.append((time.perf_counter(), piece))
    got = read_stream(sent, pieces)
    if got.completion_tokens != gen or not got.token_times:
        raise EngineStepError(f"a timed request got {got.completion_tokens} tokens, not {gen} "
                              "(the engine did not honour min_tokens/ignore_eos)")
    return got


@dataclass(frozen=True)
class Timed:
    steps_s: tuple[float, ...]  # each round's decode step
    short_ttft_s: tuple[float, ...]  # each round's time to first token, SHORT_PROMPT tokens
    long_ttft_s: tuple[float, ...]  # and LONG_PROMPT tokens
    # each round's time to first token of LONG_PROMPT new tokens after the cached context of
    # ``depth_tokens``, and the cached tokens the server's usage counted (empty: not timed)
    depth_ttft_s: tuple[float, ...] = ()
    depth_cached: tuple[int, ...] = ()
    depth_tokens: int = 0


def time_served(served: Served, vocab: int, *, rounds: int = ROUNDS, steps: int = STEPS,
                seed: int | None = None, depth: int = DEPTH_CONTEXT) -> Timed:
    """Time a running engine as loadgen does, one stream at a time: per round a short prompt
    (time to first token), a long one that then generates ``steps`` + 1 tokens (its time to
    first token and its decode step), and as many new tokens after a cached context of
    ``depth`` tokens (0: not timed), that context sent once before the rounds and the same in
    every round. Every other prompt is new token ids, so that nothing else comes from the
    prefix cache: drawn from a fresh seed on every call unless ``seed`` is given (a second
    timing of one engine with the first one's prompts met them cached: a 512-token first
    token 3.6x faster than loadgen's). :class:`EngineStepError` (one line) when the engine
    fails a request."""
    rng = random.Random(seed)  # None: seeded from the OS, as loadgen draws a seed per run

    def ids(n: int) -> list[int]:  # above the few special ids a vocabulary starts with
        return [rng.randrange(min(5, vocab - 1), vocab) for _ in range(n)]

    short, long_, step, deep, cached = [], [], [], [], []
    context = ids(depth)
    try:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            for _ in range(2):  # a fresh engine's first requests are slow
                _stream(client, served, ids(LONG_PROMPT), 8)
            if depth:  # into the prefix cache, where an agent's previous turn left it
                _stream(client, served, context, 1)
            for _ in range(rounds):
                short.append(_stream(client, served, ids(SHORT_PROMPT), 2).ttft_s)
                got = _stream(client, served, ids(LONG_PROMPT), steps + 1)
                long_.append(got.ttft_s)
                step.append(max(1e-6, got.step_s))
                if depth:
                    at = _stream(client, served, context + ids(LONG_PROMPT), 1)
                    if at.cached_tokens is not None:
                        deep.append(at.ttft_s)
                        cached.append(at.cached_tokens)
    except httpx.HTTPError as exc:
        raise EngineStepError(f"a timed request to {served.url} failed: "
                              f"{type(exc).__name__}: {str(exc)[:200]}") from None
    # a server that does not count cached tokens leaves attention untimed, never guessed
    timed_depth = len(deep) == rounds
    return Timed(tuple(step), tuple(short), tuple(long_), tuple(deep) if timed_depth else (),
                 tuple(cached) if timed_depth else (), depth if timed_depth else 0)


def record(key: StepKey, timed: Timed, *, params: int, weight_bytes: int,
           now: str | None = None) -> EngineStep:
    """The kept measurement: medians of the rounds; at depth, the median of each round's
    difference from its own long prompt (the two timed seconds apart, so a machine whose speed
    moves between rounds moves both)."""
    fixed, per_token = prefill_line(statistics.median(timed.short_ttft_s),
                                    statistics.median(timed.long_ttft_s))
    depth: tuple[int | None, int | None, int | None, float | None] = (None, None, None, None)
    if timed.depth_ttft_s and len(timed.depth_ttft_s) == len(timed.long_ttft_s):
        extra = statistics.median(d - a for d, a in zip(timed.depth_ttft_s, timed.long_ttft_s,
                                                        strict=True))
        depth = (timed.depth_tokens, LONG_PROMPT,
                 min(timed.depth_tokens, int(statistics.median_low(timed.depth_cached))), extra)
    return EngineStep(key, statistics.median(timed.steps_s), timed.steps_s, params, weight_bytes,
                      now or time.strftime("%Y-%m-%dT%H:%M:%S"), fixed, per_token, *depth)
