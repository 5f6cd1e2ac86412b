"""The serving host's own CPU work around the engine, timed with the installed vLLM's functions.

`launcher probe --measure` times, on the machine that will run the API server, the front-end
work the planner's host profile holds (launcher/planner/hardware.py ``HostProfile``):

- a prompt's length on its way to the first token, before any GPU work: the proxy's JSON parse
  of the body, vLLM's completion request parse and validation, the IPC to the engine core
  (msgpack) and the prefix cache's block hashing; a short request's way in through the same
  functions (``request_s``), and per token the line from it to a 32,000-token prompt's
  (``prompt_token_s``);
- a step's output path (``step_s`` fixed, ``seq_step_s`` per sequence): vLLM's OutputProcessor
  turning one new token of each running sequence into its output (incremental detokenising
  included) and the completion stream chunk's JSON for each, at 1 and 32 sequences.

These are the functions benchmarks/host_prompt_cost.py timed on the lent H200's host (where the
shipped profile comes from); the planner scales the shipped profile's terms by what the same
functions cost here. Where this module meets vLLM's internals is one typed seam,
:class:`FrontEnd`, implemented by :mod:`launcher.probe.vllmfront` in a worker process: a vLLM
without those functions (renamed, moved, other signatures) gives a one-line reason, and the
planner keeps the shipped profile and says so.

Pure parts (the record, its JSON, its cache key, the timing arithmetic over a FrontEnd) need
no vLLM; a test drives them with a front end of plain functions.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from launcher.probe.kernels import number_field, text_field, write_cache_json

FORMAT = 1
# The prompt lengths the per-token line goes through (a short request's and the H200 timing's
# longest), and the sequences of the output path's two points. Each figure is the least of
# REPEATS calls (timeit's rule: another process's load only adds to a function's own cost; on
# this project's busy 2-core machine medians of 7 moved 0.46-1.5 us a token from run to run).
# The timing takes about a second once vLLM is imported (15 s on that machine).
LONG_PROMPT = 32000
SHORT_PROMPT = 16
MANY_SEQUENCES = 32
REPEATS = 9
OUTPUT_STEPS = 64


class HostCostError(ValueError):
    """A host timing that failed or a saved one that cannot be read (one line)."""


@dataclass(frozen=True)
class HostKey:
    cpu: str  # /proc/cpuinfo's model name
    cores: int  # logical CPUs this process may use
    vllm: str  # the installed vLLM's version

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class HostTiming:
    """The timed parts, in seconds, one thread (what the functions cost, not the whole path)."""

    key: HostKey
    prompt_token_s: float  # per prompt token on the way in
    request_s: float  # a SHORT_PROMPT request's way in through the same functions
    step_s: float  # the output path's fixed part per step
    seq_step_s: float  # the output path per sequence per step
    measured_at: str


# ------------------------------------------------------------------------------------- JSON
def to_json(rec: HostTiming) -> dict[str, Any]:
    return {"version": FORMAT, **asdict(rec)}


def _num(raw: Any, what: str, hi: float) -> float:
    return number_field(raw, what, hi, HostCostError)


def _text(raw: Any, what: str) -> str:
    return text_field(raw, what, HostCostError)


def from_json(raw: Any) -> HostTiming:
    """A saved timing; :class:`HostCostError` (one line) for anything unreadable. The bounds
    are far outside any host (a millisecond a prompt token, a second a step): a value past
    them is a broken record, not a slow machine."""
    if not isinstance(raw, dict):
        raise HostCostError("a host timing record is not a JSON object")
    if raw.get("version") != FORMAT:
        raise HostCostError(f"host timing record version {str(raw.get('version'))[:20]!r} "
                            f"is not {FORMAT}")
    k = raw.get("key")
    if not isinstance(k, dict):
        raise HostCostError("the host timing record has no key object")
    key = HostKey(_text(k.get("cpu"), "cpu"), int(_num(k.get("cores"), "cores", 1e5)),
                  _text(k.get("vllm"), "vllm"))
    return HostTiming(
        key,
        _num(raw.get("prompt_token_s"), "prompt_token_s", 1e-3),
        _num(raw.get("request_s"), "request_s", 1.0),
        _num(raw.get("step_s"), "step_s", 1.0),
        _num(raw.get("seq_step_s"), "seq_step_s", 0.1),
        _text(raw.get("measured_at"), "measured_at"),
    )


def parse(text: str) -> HostTiming:
    """A record from its JSON text (a worker's output or a cache file)."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise HostCostError(f"a host timing record is not JSON: {str(exc)[:80]}") from None
    return from_json(raw)


def cache_path(cache_dir: Path, key: HostKey) -> Path:
    return cache_dir / "host-cost" / f"{key.digest()}.json"


def save(cache_dir: Path, rec: HostTiming) -> Path | None:
    """Keep the timing where a later plan finds it; None when the cache is not writable."""
    return write_cache_json(cache_path(cache_dir, rec.key), to_json(rec))


def load(cache_dir: Path, key: HostKey) -> HostTiming | None:
    """The kept timing for ``key`` (this CPU, this many cores, this vLLM); None when there is
    none, it cannot be read, or it is another host's."""
    try:
        rec = parse(cache_path(cache_dir, key).read_text())
    except (OSError, HostCostError):
        return None
    return rec if rec.key == key else None


# ---------------------------------------------------------------------------------- timing
class FrontEnd(Protocol):
    """The seam to vLLM's internals: each call runs the installed vLLM's own function(s)."""

    def parse_body(self, body: bytes) -> object:
        """The proxy's and vLLM's API server's parse and validation of a completion body."""

    def ipc(self, ids: list[int]) -> object:
        """The token ids' way to the engine core and back (msgpack, as vLLM's IPC)."""

    def hash_blocks(self, ids: list[int]) -> object:
        """The prefix cache's chained hashes of every full block of ``ids``."""

    def output_step(self, sequences: int) -> Callable[[], object]:
        """A function that runs one step's output path for ``sequences`` running requests:
        one new token each through the output processor and the stream chunk's JSON."""


def least_s(f: Callable[[], object], n: int = REPEATS,
            clock: Callable[[], float] = time.perf_counter) -> float:
    best = math.inf
    for _ in range(n):
        t = clock()
        f()
        best = min(best, clock() - t)
    return best


def _way_in_s(fe: FrontEnd, n: int, rng: random.Random, clock: Callable[[], float]) -> float:
    ids = [rng.randrange(5, 4096) for _ in range(n)]
    body = json.dumps({"model": "m", "prompt": ids, "max_tokens": 128, "stream": True}).encode()
    return (least_s(lambda: fe.parse_body(body), clock=clock)
            + least_s(lambda: fe.ipc(ids), clock=clock)
            + least_s(lambda: fe.hash_blocks(ids), clock=clock))


def time_host(fe: FrontEnd, key: HostKey, *, seed: int | None = None, now: str | None = None,
              clock: Callable[[], float] = time.perf_counter) -> HostTiming:
    """Time ``fe``'s functions, one thread: the way in at SHORT_PROMPT and LONG_PROMPT tokens
    (the line through them: a request's fixed part and a part per token), the output path at 1
    and MANY_SEQUENCES sequences (likewise: per step and per sequence). A noisy point that makes
    a slope non-positive keeps the larger figure whole, as a part per token or sequence."""
    rng = random.Random(seed)
    short = _way_in_s(fe, SHORT_PROMPT, rng, clock)
    long_ = _way_in_s(fe, LONG_PROMPT, rng, clock)
    per_token = (long_ - short) / (LONG_PROMPT - SHORT_PROMPT)
    if per_token <= 0:
        per_token = long_ / LONG_PROMPT
    one = least_s(fe.output_step(1), OUTPUT_STEPS, clock)
    many = least_s(fe.output_step(MANY_SEQUENCES), OUTPUT_STEPS, clock)
    per_seq = (many - one) / (MANY_SEQUENCES - 1)
    if per_seq <= 0:
        per_seq = many / MANY_SEQUENCES
    return HostTiming(key, per_token, max(1e-7, short), max(1e-7, one - per_seq), per_seq,
                      now or time.strftime("%Y-%m-%dT%H:%M:%S"))
