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
import os
import pickle
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Protocol

from launcher.probe import keptrecord
from launcher.probe.keptrecord import number_field, text_field, write_cache_json
from topocommon import jsontext

FORMAT = 2  # 2: the timing's steadiness (Steadiness); 1 (read, said in the reason): one pass
# The prompt lengths the per-token line goes through (a short request's and the H200 timing's
# longest), and the sequences of the output path's two points.
LONG_PROMPT = 32000
SHORT_PROMPT = 16
MANY_SEQUENCES = 32
# The timing runs in ROUNDS, each the least of CALLS calls of each way-in function and of
# OUTPUT_STEPS output steps, beside a fixed reference workload; the figures are the median of the
# rounds the host ran at its usual speed. Measured on this project's 2-core build machine
# (benchmarks/host_cost_spread.py, docs/planner.md): one pass of least-of-9 gave speeds
# 0.75-1.23 over six fresh workers, idle, because (a) the machine's own speed moves 1.5x within
# seconds (the same call's CPU time 4.7 then 7.6 ms, the reference workload likewise), (b) the
# first pass of a process ran the way in 40% slower than the next, and (c) another CPU-bound
# process preempted the 7 ms calls (per token x2), which wall time counted. So: CPU time of this
# thread (preemption excluded), a warm-up round, the median over rounds, rounds whose reference
# ran slow dropped, and rounds until two estimates agree, within TIME_BUDGET_S.
CALLS = 5
OUTPUT_STEPS = 16
MIN_ROUNDS = 3
MAX_ROUNDS = 16
AGREE = 0.03  # two consecutive estimates of the speed this close end the timing
SLOW_ROUND = 1.10  # a round whose reference ran this much slower than the fastest is dropped
TIME_BUDGET_S = 3.0
MIN_TIME_S = 1.0  # and never end before this: the build machine's slow spells last seconds
# a timing whose terms moved more than this over its rounds, or whose host slowed this much, or
# where other processes kept at least half the other cores busy, is said to be unsteady
UNSTEADY = 1.10
# After the rounds, the reference workload SUSTAIN_SAMPLES times, SUSTAIN_GAP_S apart (each the
# least of CALLS runs): the pace a thread that runs for minutes (an engine core, the API server)
# keeps on this host on average (Steadiness.sustained_s, the samples' harmonic mean, and
# .sustained, that over their fastest tenth's harmonic mean). The rounds' least-of figures are
# the host at whatever speed it ran during the few seconds of the rounds; on the lent H200 that
# was not the serving pace.
# MEASURED there (benchmarks/gpu/results/2026-12-03-h200-table7): the reference ran at
# ~0.46-0.55 or ~0.80-1.10 ms, switching from one sample to the next on every vCPU, no steal
# counted; pinned to each vCPU of the idle machine its mean was 0.58 ms, 1.26x its tenth
# percentile; the six timings of that session landed at 0.53-1.03 ms, and the engines'
# host-bound steps ran 1.17-1.25x what the fast-level timings planned. So the planner scales the
# timed figures to the sampled pace (HostTiming.pace: sustained_s over the rounds' reference_s).
# (The 0.58 ms and 1.26x above are arithmetic means, as that session computed them.) Why the
# HARMONIC mean: the samples are points in time, spread evenly, each reading the speed level the
# host ran at then; a thread that keeps running does work at the time-average of its SPEED (1 /
# a sample's time), so one unit of its work takes the harmonic mean of the sampled times, not
# their arithmetic mean (half at 0.5 ms, half at 1.0 ms: 0.667 ms, not 0.75). A mechanism, not
# a fit: the eleventh table's 252 samples (results/2026-12-04-h200-table11/host-speed.jsonl,
# ref_cpu_ms) give 0.672 ms harmonic, 0.725 arithmetic; the same file's busy windows (the
# reference back to back, busy_mean_ms weighted by busy_runs) took 0.689 ms a run.
SUSTAIN_SAMPLES = 100
SUSTAIN_GAP_S = 0.05
# What one engine kept over a sampled pace: MEASURED on the lent H200, four host-bound engines'
# single-stream decode steps over the floor planned at their machine's fast level, divided by
# the pace sampled there (results/2026-12-03-h200-table7 and -table8: Qwen3-0.6B 0.69,
# Gemma-3-270M 0.95, Qwen2.5-1.5B 1.06, Gemma-3-1B 1.13). The mean is near 1, so the sampled
# pace stays the planned one; the spread is said in the plan's reason, never applied: nothing
# measured before a run told which end that run would land at. These ratios were measured
# against the samples' ARITHMETIC mean, the pace before it became their harmonic mean.
PACE_SPREAD = (0.69, 1.13)
# a pace further from 1 than this is no host's (the lent H200's two speeds were 1.9x apart):
# a record that says so is broken, and its figures are planned as timed
MAX_PACE = 4.0


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
class Steadiness:
    """How steady the timing was: what the plan's reason line says of it."""

    rounds: int  # the rounds the figures are the median of
    dropped: int  # rounds left out: the reference workload ran over SLOW_ROUND slower in them
    # (term, its largest round over its smallest, over those rounds), for the four terms
    spread: tuple[tuple[str, float], ...]
    speed_spread: float  # likewise of sqrt(prompt_token_s x seq_step_s), the planner's speed
    host_slowed: float  # the reference workload's slowest round over its fastest, every round
    others_busy: float  # cores other processes kept busy during the timing; -1: not known
    # the reference workload's median over the kept rounds, CPU seconds (0: not recorded): a
    # slow spell through a whole timing moves no figure within it, only this against another
    # timing of the same host (on the 2-core build machine 1 fresh worker in 6 timed x1.45 slow)
    reference_s: float = 0.0
    # where the same host's kept timing (``before``, its measured_at) ran the reference faster:
    # this one's reference over that one's (1.0: none kept, or not slower); see :func:`save`
    slower_than_before: float = 1.0
    before: str = ""
    # the reference's SUSTAIN_SAMPLES samples, spread over ~5 s after the rounds: their
    # harmonic mean over that of their fastest tenth (0: not sampled, a record from before);
    # see SUSTAIN_SAMPLES
    sustained: float = 0.0
    # those samples' harmonic mean, CPU seconds (0: not sampled): the pace a long-running thread
    # keeps (a record written before the harmonic mean holds their arithmetic mean)
    sustained_s: float = 0.0

    def unsteady(self, cores: int) -> list[str]:
        """Why these figures may be higher than this host's at rest (empty: none): other
        processes busy on at least half the other cores (sharing caches, memory and clock
        with the timed thread; a 2-core build machine's timing ran 1.6x slower beside two
        CPU-bound loops), or the kept rounds' speed still apart (a host slowed through
        the whole timing, which its reference cannot show)."""
        why = []
        if self.others_busy >= max(0.5, 0.5 * (cores - 1)):
            why.append(f"other processes kept {self.others_busy:.1f} of {cores} cores busy")
        if self.speed_spread > UNSTEADY:
            why.append(f"its kept rounds' speed moved x{self.speed_spread:.2f}")
        if self.slower_than_before > UNSTEADY:
            why.append(f"its reference ran x{self.slower_than_before:.2f} slower than in this "
                       f"host's timing of {self.before}")
        return why


@dataclass(frozen=True)
class HostTiming:
    """The timed parts, in seconds, one thread (what the functions cost, not the whole path)."""

    key: HostKey
    prompt_token_s: float  # per prompt token on the way in
    request_s: float  # a SHORT_PROMPT request's way in through the same functions
    step_s: float  # the output path's fixed part per step
    seq_step_s: float  # the output path per sequence per step
    measured_at: str
    steadiness: Steadiness | None = None  # None: a format-1 record (one pass, not measured)

    def pace(self) -> float:
        """How much longer than the timed figures this host's work takes a thread that keeps
        running (an engine core): the sustained samples' harmonic mean reference (what one unit
        of a running thread's work takes, SUSTAIN_SAMPLES) over the rounds' (below
        1 where the rounds ran in a slow spell). 1.0 where either was not recorded (a record
        from before the sampling: its figures are planned as timed) or the ratio is past
        MAX_PACE."""
        st = self.steadiness
        if st is None or st.sustained_s <= 0 or st.reference_s <= 0:
            return 1.0
        pace = st.sustained_s / st.reference_s
        return pace if 1 / MAX_PACE <= pace <= MAX_PACE else 1.0

    def pace_ends(self) -> tuple[float, float]:
        """The fastest and the slowest pace this host's work was seen at before the run, on
        the scale of :meth:`pace` (1.0: the rounds' reference): fast, the least of the sampled
        fastest tenth's harmonic mean (sustained_s / sustained), the rounds' and the planned
        pace; slow, the greater of the rounds' and the planned. So the planned pace lies between
        them whichever way the rounds ran: issue 22's fifteenth table (benchmarks/gpu/
        host-pace-t15.md) timed its rounds in a slow spell (0.974 ms) over a sampled pace of
        0.7065 ms, and its engine ran at the fast level (~0.47-0.565 ms, the fastest tenth 0.495
        ms), below both ends of a range from the rounds to the planned pace. (pace, pace) where
        the pace is 1.0 (no sampling, or past MAX_PACE); the fastest tenth is left out where it
        was not sampled or lies past MAX_PACE of the rounds (no host's)."""
        pace = self.pace()
        st = self.steadiness
        if pace == 1.0 or st is None:
            return pace, pace
        fast = min(1.0, pace)
        if st.sustained > 0 and (tenth := st.sustained_s / st.sustained / st.reference_s) \
                >= 1 / MAX_PACE:
            fast = min(fast, tenth)
        return fast, max(1.0, pace)

    def steadiness_note(self) -> str:
        """The reason line's words on how steady the timing was."""
        st = self.steadiness
        if st is None:
            return ("one pass, its steadiness not measured (a format-1 record: `probe "
                    "--measure` again measures it)")
        worst, ratio = max(st.spread, key=lambda item: item[1], default=("none", 1.0))
        note = (f"median of {st.rounds} rounds, speed within x{st.speed_spread:.2f} "
                f"(widest term {worst} x{ratio:.2f})")
        if st.reference_s:
            note += f", reference workload {st.reference_s * 1e3:.2f} ms"
        if st.dropped:
            note += (f", {st.dropped} more dropped (the reference ran up to "
                     f"x{st.host_slowed:.2f} slower in them)")
        why = st.unsteady(self.key.cores)
        note += (f"; MAY BE HIGH: {'; '.join(why)}; time again on an idle host"
                 if why else "")
        pace = self.pace()
        if pace != 1.0:
            note += (f"; planned at the pace a running thread kept here: the reference's "
                     f"harmonic mean over {SUSTAIN_SAMPLES} samples, "
                     f"{st.sustained_s * 1e3:.2f} ms, "
                     f"x{pace:.2f} the rounds' (x{st.sustained:.2f} its fastest tenth)")
            if (apart := max(pace, 1 / pace)) > UNSTEADY:
                # an average, not what one engine keeps (PACE_SPREAD): say which way it may go
                note += (f"; an engine may keep the rounds' speed instead (on the lent H200 "
                         f"engines kept x{PACE_SPREAD[0]:.2f}-{PACE_SPREAD[1]:.2f} of a sampled "
                         f"pace), so host-bound figures may come out up to x{apart:.2f} "
                         f"{'faster' if pace > 1 else 'slower'} than planned")
        elif st.sustained > UNSTEADY:
            note += (f"; MAY BE LOW: a thread that kept running averaged x{st.sustained:.2f} "
                     f"its fastest speed here (the CPUs' speed moved while sampled), so "
                     f"host-bound figures may be up to that much slower than planned")
        return note


# ------------------------------------------------------------------------------------- JSON
def to_json(rec: HostTiming) -> dict[str, Any]:
    """The record's JSON: format 2, or 1 for a record read from a format-1 file (no
    steadiness), so that what is written reads back the same."""
    raw = asdict(rec)
    st = raw.pop("steadiness")
    if st is None:
        return {"version": 1, **raw}
    st["spread"] = dict(st["spread"])
    return {"version": FORMAT, **raw, "steadiness": st}


def _num(raw: Any, what: str, hi: float) -> float:
    return number_field(raw, what, hi, HostCostError)


def _text(raw: Any, what: str) -> str:
    return text_field(raw, what, HostCostError)


def _steadiness(raw: Any) -> Steadiness:
    if not isinstance(raw, dict) or not isinstance(raw.get("spread"), dict):
        raise HostCostError("the host timing record's steadiness is not an object with a spread")
    return Steadiness(
        int(_field(raw, "rounds", 1e4)),
        int(_field(raw, "dropped", 1e4, unset=(0,))),
        tuple((str(term)[:40], _num(v, f"spread of {str(term)[:40]}", 1e6))
              for term, v in raw["spread"].items()),
        _field(raw, "speed_spread", 1e6),
        _field(raw, "host_slowed", 1e6),
        # 0: nothing else ran; -1: not known (no /proc/stat)
        _field(raw, "others_busy", 1e5, unset=(0, -1)),
        # absent (a record from before they were written) or 0: not recorded, not sampled
        _field(raw, "reference_s", 1.0, absent=0.0, unset=(0,)),
        _field(raw, "slower_than_before", 1e6, absent=1.0),
        _text(raw.get("before", ""), "before"),
        _field(raw, "sustained", 1e3, absent=0.0, unset=(0,)),
        _field(raw, "sustained_s", 1.0, absent=0.0, unset=(0,)),
    )


def _field(raw: dict[str, Any], what: str, hi: float, *, absent: float | None = None,
           unset: tuple[float, ...] = ()) -> float:
    """The record's number ``what``: ``absent`` where it has none (None: it must have one), the
    value itself where it is one of ``unset`` (the field's "none" values; a number, not a bool),
    else a positive number below ``hi``."""
    value = raw.get(what)
    if value is None and absent is not None:
        return absent
    if value in unset and not isinstance(value, bool):
        return float(value)
    return _num(value, what, hi)


def from_json(raw: Any) -> HostTiming:
    """A saved timing; :class:`HostCostError` (one line) for anything unreadable. The bounds
    are far outside any host (a millisecond a prompt token, a second a step): a value past
    them is a broken record, not a slow machine. A format-1 record (one pass, before the
    rounds) reads with no steadiness, which the plan's reason line then says."""
    if not isinstance(raw, dict):
        raise HostCostError("a host timing record is not a JSON object")
    version = raw.get("version")
    if version not in (1, FORMAT) or isinstance(version, bool):
        raise HostCostError(f"host timing record version {str(version)[:20]!r} "
                            f"is not 1 or {FORMAT}")
    k = raw.get("key")
    if not isinstance(k, dict):
        raise HostCostError("the host timing record has no key object")
    key = HostKey(_text(k.get("cpu"), "cpu"), int(_field(k, "cores", 1e5)),
                  _text(k.get("vllm"), "vllm"))
    return HostTiming(
        key,
        _field(raw, "prompt_token_s", 1e-3),
        _field(raw, "request_s", 1.0),
        _field(raw, "step_s", 1.0),
        _field(raw, "seq_step_s", 0.1),
        _text(raw.get("measured_at"), "measured_at"),
        None if version == 1 else _steadiness(raw.get("steadiness")),
    )


def parse(text: str) -> HostTiming:
    """A record from its JSON text (a worker's output or a cache file)."""
    try:
        raw = jsontext.loads(text)
    except ValueError as exc:
        raise HostCostError(f"a host timing record is not JSON: {str(exc)[:80]}") from None
    return from_json(raw)


def cache_path(cache_dir: Path, key: HostKey) -> Path:
    return cache_dir / "host-cost" / f"{key.digest()}.json"


def save(cache_dir: Path, rec: HostTiming) -> Path | None:
    """Keep the timing where a later plan finds it; None when the cache is not writable. A
    slow spell through a whole timing moves nothing inside it, so where this host's kept timing
    ran the reference workload more than UNSTEADY faster, the new one (still the one kept: the
    host may be slower for good) says so, and the plan's reason line with it."""
    return write_cache_json(cache_path(cache_dir, rec.key), to_json(against_kept(cache_dir, rec)))


def against_kept(cache_dir: Path, rec: HostTiming) -> HostTiming:
    """``rec`` with its reference compared with this host's kept timing's (:func:`save`)."""
    old, st = load(cache_dir, rec.key), rec.steadiness
    if old is None or old.steadiness is None or st is None:
        return rec
    if not (old.steadiness.reference_s > 0 and st.reference_s > 0):
        return rec
    ratio = st.reference_s / old.steadiness.reference_s
    if ratio <= UNSTEADY:
        return rec
    return replace(rec, steadiness=replace(st, slower_than_before=round(ratio, 3),
                                           before=old.measured_at))


KEPT = keptrecord.Kind(
    "the host timing `probe --measure` kept", "planned with the shipped server-host profile",
    from_json, lambda rec: rec.key, again="`launcher probe --measure` times this host again")


def read(cache_dir: Path, key: HostKey) -> tuple[HostTiming | None, str]:
    """The kept timing for ``key`` (this CPU, this many cores, this vLLM), or the one-line
    reason a kept file cannot be used (:func:`keptrecord.read`); (None, "") where none is."""
    return keptrecord.read(KEPT, cache_path(cache_dir, key), key)


def load(cache_dir: Path, key: HostKey) -> HostTiming | None:
    """The kept timing for ``key``; None when there is none or it cannot be used."""
    return read(cache_dir, key)[0]


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


def least_s(f: Callable[[], object], n: int,
            clock: Callable[[], float] = time.thread_time) -> float:
    best = math.inf
    for _ in range(n):
        t = clock()
        f()
        best = min(best, clock() - t)
    return best


def reference_work() -> object:
    """A fixed piece of pure-Python work like the way in's (a JSON parse, pickling, sha256),
    timed beside every round: where it runs slower, the host itself was slower then."""
    ids = json.loads(_REFERENCE_BODY)
    return [hashlib.sha256(pickle.dumps(tuple(ids[i:i + 16]))).digest()
            for i in range(0, len(ids), 16)]


_REFERENCE_BODY = json.dumps(list(range(1000, 5000))).encode()


def cpu_seconds() -> tuple[float, float] | None:
    """(every CPU's busy seconds on this machine, this process's CPU seconds) from /proc/stat
    and os.times(); None where there is no /proc/stat. Busy: user, nice, system, irq, softirq
    and steal (another virtual machine's use of this one's CPUs)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        ticks = os.sysconf("SC_CLK_TCK")
        busy = sum(int(fields[i]) for i in (1, 2, 3, 6, 7, 8)) / ticks
    except (OSError, ValueError, IndexError):
        return None
    own = os.times()
    return busy, own.user + own.system


@dataclass(frozen=True)
class _Round:
    reference: float  # the reference workload's least time in this round (the slowest of 3)
    short: float  # the way in at SHORT_PROMPT tokens
    long: float  # and at LONG_PROMPT
    one: float  # the output path at 1 sequence
    many: float  # and at MANY_SEQUENCES

    def terms(self) -> dict[str, float]:
        """The record's four terms from this round's points: the lines through them. A noisy
        point that makes a slope non-positive keeps the larger figure whole, as a part per
        token or sequence."""
        per_token = (self.long - self.short) / (LONG_PROMPT - SHORT_PROMPT)
        if per_token <= 0:
            per_token = self.long / LONG_PROMPT
        per_seq = (self.many - self.one) / (MANY_SEQUENCES - 1)
        if per_seq <= 0:
            per_seq = self.many / MANY_SEQUENCES
        return {"prompt_token_s": per_token, "request_s": max(1e-7, self.short),
                "step_s": max(1e-7, self.one - per_seq), "seq_step_s": per_seq}


def _speed(terms: dict[str, float]) -> float:
    """The planner's host speed up to a constant (hardware.host_profile: the geometric mean of
    the per-token and per-sequence terms' ratios to the H200 host's)."""
    return math.sqrt(terms["prompt_token_s"] * terms["seq_step_s"])


def sustained_pace(reference: Callable[[], object], clock: Callable[[], float],
                   sleep: Callable[[float], None], samples: int,
                   gap_s: float = SUSTAIN_GAP_S) -> tuple[float, float]:
    """The ``reference`` workload ``samples`` times (each the least of CALLS runs on
    ``clock``) ``gap_s`` apart: (their harmonic mean in seconds, that over their fastest
    tenth's harmonic mean). The harmonic mean because the samples are points in time: a thread
    that keeps running works at the time-average of the speed they read, so a unit of its work
    takes the harmonic mean of their times (SUSTAIN_SAMPLES). The ratio is 1.0 on a host whose
    speed holds, more where the CPUs' speed moves while a thread runs (SUSTAIN_SAMPLES says what
    the lent H200 showed). A sample with no measurable time (0 on ``clock``'s resolution)
    says nothing of the speed and is left out (in a harmonic mean it would make the pace 0);
    where none took measurable time: (0.0, 1.0), as not sampled (HostTiming.pace: 1.0)."""
    times = []
    for i in range(max(1, samples)):
        if i:
            sleep(gap_s)
        times.append(least_s(reference, CALLS, clock))
    timed = sorted(t for t in times if t > 0)
    if not timed:
        return 0.0, 1.0
    pace = statistics.harmonic_mean(timed)
    low = statistics.harmonic_mean(timed[: max(1, len(timed) // 10)])
    return pace, pace / low


def _median_round(rounds: list[_Round]) -> _Round:
    return _Round(*(statistics.median(getattr(r, f.name) for r in rounds)
                    for f in fields(_Round)))


def _kept(rounds: list[_Round]) -> list[_Round]:
    """The rounds the host ran at its usual speed: the reference within SLOW_ROUND of its
    fastest round (all of them where the reference took no measurable time)."""
    fastest = min(r.reference for r in rounds)
    if fastest <= 0:
        return rounds
    return [r for r in rounds if r.reference <= SLOW_ROUND * fastest]


def time_host(fe: FrontEnd, key: HostKey, *, seed: int | None = None, now: str | None = None,
              clock: Callable[[], float] = time.thread_time,
              reference: Callable[[], object] = reference_work,
              wall: Callable[[], float] = time.perf_counter,
              busy: Callable[[], tuple[float, float] | None] = cpu_seconds,
              sustain_samples: int = 0,
              sleep: Callable[[float], None] = time.sleep) -> HostTiming:
    """Time ``fe``'s functions, one thread, on ``clock`` (this thread's CPU time: another
    process that takes the CPU away adds nothing): the way in at SHORT_PROMPT and LONG_PROMPT
    tokens (the line through them: a request's fixed part and a part per token), the output
    path at 1 and MANY_SEQUENCES sequences (likewise: per step and per sequence), in rounds
    beside ``reference``. A first round warms up and is dropped; then rounds until at least
    MIN_ROUNDS kept ones (:func:`_kept`) give two consecutive estimates of the speed within
    AGREE after MIN_TIME_S, MAX_ROUNDS, or TIME_BUDGET_S of ``wall``. The figures are the
    kept rounds' median; the record says how far they spread, how much the host slowed, and
    how busy other processes kept the machine (``busy``) meanwhile, and, with
    ``sustain_samples``, how much slower than at its fastest a running thread goes on average
    (:func:`sustained_pace`, after the rounds)."""
    rng = random.Random(seed)
    ids = {n: [rng.randrange(5, 4096) for _ in range(n)] for n in (SHORT_PROMPT, LONG_PROMPT)}
    bodies = {n: json.dumps({"model": "m", "prompt": v, "max_tokens": 128,
                             "stream": True}).encode() for n, v in ids.items()}

    def way_in(n: int) -> float:
        return (least_s(lambda: fe.parse_body(bodies[n]), CALLS, clock)
                + least_s(lambda: fe.ipc(ids[n]), CALLS, clock)
                + least_s(lambda: fe.hash_blocks(ids[n]), CALLS, clock))

    steps = fe.output_step(1), fe.output_step(MANY_SEQUENCES)

    def one_round() -> _Round:  # the reference before, between and after the two paths
        refs = [least_s(reference, CALLS, clock)]
        short, long_ = way_in(SHORT_PROMPT), way_in(LONG_PROMPT)
        refs.append(least_s(reference, CALLS, clock))
        one = least_s(steps[0], OUTPUT_STEPS, clock)
        many = least_s(steps[1], OUTPUT_STEPS, clock)
        refs.append(least_s(reference, CALLS, clock))
        return _Round(max(refs), short, long_, one, many)

    start, cpu_start = wall(), busy()
    one_round()  # warm-up: a process's first pass ran the way in 40% slower than the next
    rounds: list[_Round] = []
    estimates: list[float] = []
    kept: list[_Round] = []
    # MAX_ROUNDS once MIN_ROUNDS are kept (a host slow in most rounds is given more of them),
    # never past the time budget
    while not rounds or (wall() - start < TIME_BUDGET_S and len(rounds) < 3 * MAX_ROUNDS
                         and (len(rounds) < MAX_ROUNDS or len(kept) < MIN_ROUNDS)):
        rounds.append(one_round())
        kept = _kept(rounds)
        if len(kept) >= MIN_ROUNDS:
            estimates.append(_speed(_median_round(kept).terms()))
            if (len(estimates) >= 2 and abs(estimates[-1] / estimates[-2] - 1) <= AGREE
                    and wall() - start >= MIN_TIME_S):
                break
    elapsed, cpu_end = wall() - start, busy()
    terms = _median_round(kept).terms()
    per_round = [r.terms() for r in kept]
    others = -1.0
    if cpu_start is not None and cpu_end is not None and elapsed > 0:
        others = max(0.0, (cpu_end[0] - cpu_start[0]) - (cpu_end[1] - cpu_start[1])) / elapsed
    refs = [r.reference for r in rounds]
    sustained_s, sustained = (sustained_pace(reference, clock, sleep, sustain_samples)
                              if sustain_samples > 0 else (0.0, 0.0))
    steadiness = Steadiness(
        rounds=len(kept), dropped=len(rounds) - len(kept),
        spread=tuple((t, max(p[t] for p in per_round) / min(p[t] for p in per_round))
                     for t in terms),
        speed_spread=max(map(_speed, per_round)) / min(map(_speed, per_round)),
        host_slowed=max(refs) / min(refs) if min(refs) > 0 else 1.0,
        others_busy=round(others, 2),
        reference_s=_median_round(kept).reference,
        sustained=round(sustained, 3), sustained_s=sustained_s)
    return HostTiming(key, terms["prompt_token_s"], terms["request_s"], terms["step_s"],
                      terms["seq_step_s"], now or time.strftime("%Y-%m-%dT%H:%M:%S"),
                      steadiness)
