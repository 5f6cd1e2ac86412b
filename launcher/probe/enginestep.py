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
through the time to first token of a short and a long prompt; medians of ROUNDS rounds. The
planner then takes the engine's overheads from it: the measured step less what the roofline gives
the tiny model's own forward pass, and the prefill's per-token rate as this CPU's rate.

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

FORMAT = 2  # 1 was the offline engine's step, without the server's per-token work
# Tokens per timed generation and rounds: enough gaps that one late event moves the mean little,
# few enough that a round takes about a second on two busy cores.
STEPS = 128
ROUNDS = 7
# The two prompts the prefill line goes through: a request's fixed cost, and loadgen's default
# prompt, whose request then times the decode steps at loadgen's default context (a 1024-token
# prompt's steps were 15% slower here than loadgen's at 512).
SHORT_PROMPT = 16
LONG_PROMPT = 512
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
    if raw.get("version") != FORMAT:
        raise EngineStepError(f"engine step record version {str(raw.get('version'))[:20]!r} "
                              f"is not {FORMAT}")
    k = raw.get("key")
    if not isinstance(k, dict):
        raise EngineStepError("the engine step record has no key object")
    key = StepKey(*(_text(k.get(f), f) for f in ("device", "vllm", "torch")))
    steps = raw.get("steps_s")
    if not isinstance(steps, list) or not steps or len(steps) > 1000:
        raise EngineStepError("steps_s is not a non-empty list")
    fixed, per_token = raw.get("prefill_fixed_s"), raw.get("prefill_token_s")
    return EngineStep(
        key,
        _num(raw.get("step_s"), "step_s", 60.0),
        tuple(_num(s, "a round's step", 60.0) for s in steps),
        int(_num(raw.get("model_params"), "model_params", 1e13)),
        int(_num(raw.get("model_weight_bytes"), "model_weight_bytes", 1e14)),
        _text(raw.get("measured_at"), "measured_at"),
        None if fixed is None else _num(fixed, "prefill_fixed_s", 60.0),
        None if per_token is None else _num(per_token, "prefill_token_s", 1.0),
    )


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
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    tokens = usage["completion_tokens"]
    return Streamed(sent, tuple(times), tokens)


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


def time_served(served: Served, vocab: int, *, rounds: int = ROUNDS, steps: int = STEPS,
                seed: int | None = None) -> Timed:
    """Time a running engine as loadgen does, one stream at a time: per round a short prompt
    (time to first token) and a long one that then generates ``steps`` + 1 tokens (its time to
    first token and its decode step). Every prompt is new token ids, so that nothing comes
    from the prefix cache: drawn from a fresh seed on every call unless ``seed`` is given (a
    second timing of one engine with the first one's prompts met them cached: a 512-token first
    token 3.6x faster than loadgen's). :class:`EngineStepError` (one line) when the engine
    fails a request."""
    rng = random.Random(seed)  # None: seeded from the OS, as loadgen draws a seed per run

    def ids(n: int) -> list[int]:  # above the few special ids a vocabulary starts with
        return [rng.randrange(min(5, vocab - 1), vocab) for _ in range(n)]

    short, long_, step = [], [], []
    try:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            for _ in range(2):  # a fresh engine's first requests are slow
                _stream(client, served, ids(LONG_PROMPT), 8)
            for _ in range(rounds):
                short.append(_stream(client, served, ids(SHORT_PROMPT), 2).ttft_s)
                got = _stream(client, served, ids(LONG_PROMPT), steps + 1)
                long_.append(got.ttft_s)
                step.append(max(1e-6, got.step_s))
    except httpx.HTTPError as exc:
        raise EngineStepError(f"a timed request to {served.url} failed: "
                              f"{type(exc).__name__}: {str(exc)[:200]}") from None
    return Timed(tuple(step), tuple(short), tuple(long_))


def record(key: StepKey, timed: Timed, *, params: int, weight_bytes: int,
           now: str | None = None) -> EngineStep:
    """The kept measurement: medians of the rounds."""
    fixed, per_token = prefill_line(statistics.median(timed.short_ttft_s),
                                    statistics.median(timed.long_ttft_s))
    return EngineStep(key, statistics.median(timed.steps_s), timed.steps_s, params, weight_bytes,
                      now or time.strftime("%Y-%m-%dT%H:%M:%S"), fixed, per_token)
