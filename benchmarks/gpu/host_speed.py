"""The host's single-thread speed over time, sampled beside a GPU session's steps.

    python benchmarks/gpu/host_speed.py [--interval 5] [--samples 0] [--busy 0 [--busy-every 1]]
        [--duty 10,25,50,75,100 --duty-seconds 2 --burst-ms 3] [--per-cpu 0.2]
        [--sweep-at-start] [--sweep-on FILE --sweep-match TEXT] [--tag TAG]
        [--threads-match vllm [--pin-ms 20]] [--parts-share 0.5]

Every ``interval`` seconds: the least of 5 runs of the host timing's reference workload
(launcher.probe.hostcost.reference_work: a JSON parse, pickling and sha256 of 4,000 ids, the
figure `probe --measure` records as "reference workload"), in this thread's CPU time and in wall
time, and the whole machine's busy and steal shares since the last sample (/proc/stat).

Why: the sixth table's probe timed its host's reference at 1.00 ms where two other machines of
the same CPU model timed 0.51-0.54 ms, and its engines then served about 1.25x slower than the
shipped host, not 1.9x (docs/planner.md, "Issue 22's sixth table"). Whether the host's speed
moves between the probe and the serving, and whether a hypervisor's steal goes with it, is what
these samples show. One sample costs ~5 ms of one core (0.1% at the default interval, 0.5% at
the 1 s issue22-table.sh uses since session 29), so it runs beside the engines without moving
what they measure. Why every second there: at 5 s a case's single-stream scenario got one or
two samples, too few to tell which of the host's two levels each request ran at (helper 100's
analysis, results/host-pace-analysis-2026-12-05.md); ``--busy-every 5`` keeps the busy thread
at the share it had beside a 5 s sampler.

The sweep (``--duty``, ``--per-cpu``; issue 22, session 28): on the lent hosts of tables 7-14
that ran the reference at two speeds ~1.9x apart, `probe --measure` plans at the pace of a thread
that never sleeps (x1.19-1.51 of its rounds) while the served engines' host-bound steps kept only
x0.66-0.86 of it. Two mechanisms would give that. (a) The pace depends on the thread's duty cycle
(a boost budget or a hypervisor's CPU credit: a thread that idles between bursts runs its bursts
fast), and an engine's host stages run in bursts between GPU waits. ``--duty`` measures it: the
reference in bursts of ``--burst-ms`` (an engine step's few ms) separated by idle gaps, at each
duty in turn for ``--duty-seconds`` (two halves, in the order given and then reversed, so that a
drift of the host over the sweep falls on every duty alike), and per duty the runs' median, p90,
mean and fastest, the median of a burst's first run against its later ones, and the wall time's
median (CPU time below wall time: the thread waited, e.g. on steal). (b) The vCPUs differ (an SMT
sibling a busy engine thread shares) and an unpinned sampler mixes them: ``--per-cpu S`` pins this
thread to each CPU it may run on in turn (os.sched_setaffinity) and runs the reference back to back
S seconds on each; afterwards the thread may run anywhere again.
A sweep's figures go into the sample's row, beside its usual fields (unchanged, so readers of the
older rows read these): "sweep" (the tag: "start", --tag, or the --sweep-on line that asked for it),
"duty" (a list, one object a duty), "per_cpu" (one object a CPU), "sweep_s" (its wall seconds).
It runs at a sample given by --sweep-at-start (the first), and at the first sample after each new
line of FILE containing TEXT (--sweep-on FILE --sweep-match TEXT: issue22-table.sh passes its
summary.txt and "ready=1", so a case's engine is swept once it serves). Its cost: one thread, at
the default duties 2 s each, 10 s of wall and 5.2 s of one core's time (sum of the duties x 2 s),
plus the per-CPU pass's S seconds of one core per CPU (16 x 0.2 = 3.2 s on the H200's host), in
which the pinned thread shares a CPU with whatever runs there: once a case, beside 15 idle cores.

Where the engine's threads ran (``--threads-match``; issue 22, session 32): table 15's Qwen2.5-1.5B
engine ran at the host's fast level while this sampler, unpinned, read the slow level in most of
its runs (benchmarks/gpu/host-pace-t15.md), and no row said which vCPUs the engine's threads sat
on. With ``--threads-match vllm`` each row gets "threads": every thread of a process whose command
line holds one of the texts (case-insensitive; vLLM titles its engine core "VLLM::EngineCore")
that used at least 1% of a core since the last sample: pid, tid, its name, the CPU it last ran on
(/proc/PID/task/TID/stat field 39) and its CPU seconds since the last sample. ``--pin-ms M`` then
times the reference pinned for M ms on each of the (up to three) CPUs the busiest of those
threads last ran on ("pinned": cpu, runs, fastest and median ms): the level of the vCPU the
engine uses, read beside its steps. Its cost: reading a few hundred small /proc files and up to
3 x M ms of one core a sample, on CPUs the engine is using (20 ms of a 1 s interval: 2% of one).

The reference's parts (``--parts-share F``, default 0.5; issue 22, session 32): on table 16's lent
H100 host the reference pinned on the engine core's own vCPU read the slow level in 83% of the
Qwen2.5-1.5B case's rows (median 0.91 ms, fast ~0.5), yet that engine's host-bound figures ran
where the planner's pace puts X ~0.60 ms (benchmarks/gpu/host-threads-t16.md): either the slow
level slows the reference's mix of work more than the engine's, or the engine dodged it. So on
each CPU of the per-CPU pass and of --pin-ms, after the reference, the sampler times its three
parts alone and a plain interpreter loop, one after another round after round, for F x the
reference's time there (--per-cpu S: F x S a CPU; --pin-ms M: F x M ms a CPU): json (json.loads
of its 4,000 ids, the C scanner), pickle (250 16-int tuples sliced, built and pickled), sha256
(of those 250 ~100-byte pickles) and loop (LOOP_N rounds of dict get/store, list append and int
arithmetic: bytecode dispatch, no library call). Each entry of "per_cpu" and "pinned" then has
"parts": {"runs": rounds, "json": {"min_ms", "med_ms"}, "pickle": ..., "sha256": ..., "loop":
...}; the older fields are unchanged. A round takes ~0.5 ms where the reference takes 0.4 (json
0.18, pickle 0.12, sha256 0.09, loop 0.13 ms on a fast core): whether a slow vCPU slows every kind
of work alike (a throttled or shared core) or only some (an SMT sibling contends for some units,
not others) is what the parts' spread against the reference's tells. Its cost: at the defaults
10 ms more of one core on each pinned CPU a sample (up to 3 x 30 ms in all of a 1-s interval, 9%
of one core, 3% of any one engine CPU) and 0.1 s more a CPU in the per-CPU pass (16 x 0.3 s in
all where it was 16 x 0.2); 0 turns it off.
Read the rows with benchmarks/gpu/host_speed_read.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# the reference's own JSON body (private to hostcost: the parts below must parse what it parses)
from launcher.probe.hostcost import _REFERENCE_BODY, reference_work

RUNS = 5
# a run this much slower than the busy window's fastest counts as the slow level (the lent H200's
# two levels were ~1.9x apart, nothing between them: results/2026-12-03-h200-table7)
SLOW = 1.4
# the parts runs' share of the reference's time on each CPU (--parts-share's default)
PARTS_SHARE = 0.5


# The reference's three parts, each timed alone (--parts-share; the module's docstring), and a
# plain interpreter loop. The pickle and sha256 parts work on what the part before made, made once
# here, so that each times its own kind of work only; json + pickle + sha256 is the reference's
# work (reference_work interleaves the last two chunk by chunk).
_IDS: list[int] = json.loads(_REFERENCE_BODY)
_CHUNKS = range(0, len(_IDS), 16)


def part_json() -> object:
    """The reference's JSON parse: 4,000 ints from their bytes (C: the json module's scanner)."""
    return json.loads(_REFERENCE_BODY)


def part_pickle() -> list[bytes]:
    """The reference's pickling: 250 tuples of 16 ints, each sliced, built and pickled."""
    return [pickle.dumps(tuple(_IDS[i:i + 16])) for i in _CHUNKS]


_BLOBS = part_pickle()


def part_sha256() -> list[bytes]:
    """The reference's hashing: sha256 of each of the 250 pickles (~100 bytes each)."""
    return [hashlib.sha256(b).digest() for b in _BLOBS]


LOOP_N = 1500


def part_loop() -> int:
    """Plain interpreter work, no C library call of any size: LOOP_N rounds of int arithmetic,
    a dict's get and store and a list's append (bytecode dispatch and small objects, the kind of
    work an engine's Python scheduler and output loop do between library calls)."""
    d: dict[int, int] = {}
    out: list[int] = []
    for i in range(LOOP_N):
        k = i & 127
        d[k] = d.get(k, 0) + i
        out.append(d[k] ^ i)
    return len(out) + len(d)


PARTS: tuple[tuple[str, Callable[[], object]], ...] = (
    ("json", part_json), ("pickle", part_pickle), ("sha256", part_sha256), ("loop", part_loop))


def proc_stat() -> tuple[float, float, float] | None:
    """(all jiffies, busy jiffies, steal jiffies) over every CPU; None without /proc/stat."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    vals = [float(x) for x in first[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (vals + [0.0] * 8)[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy + idle + iowait, busy, steal


def sample() -> tuple[float, float]:
    """(least CPU seconds, least wall seconds) of RUNS runs of the reference workload."""
    cpu, wall = [], []
    for _ in range(RUNS):
        c0, w0 = time.thread_time(), time.perf_counter()
        reference_work()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return min(cpu), min(wall)


def back_to_back(seconds: float) -> list[float]:
    """The reference's CPU seconds, run after run for ``seconds`` of wall (at least one run)."""
    runs: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or not runs:
        c0 = time.thread_time()
        reference_work()
        runs.append(time.thread_time() - c0)
    return runs


def parts_back_to_back(seconds: float) -> dict[str, list[float]]:
    """Each of PARTS once in turn, round after round, for ``seconds`` of wall (at least one
    round): each part's CPU seconds, run by run."""
    runs: dict[str, list[float]] = {name: [] for name, _ in PARTS}
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or not runs["json"]:
        for name, f in PARTS:
            c0 = time.thread_time()
            f()
            runs[name].append(time.thread_time() - c0)
    return runs


def busy(seconds: float) -> dict[str, float]:
    """The reference back to back for ``seconds`` (a thread that never sleeps, as an engine
    core's does not while it serves): its first run, mean, fastest, and the share of runs at the
    slow level. Why: the eighth table's two host-bound engines ran x0.93 and x1.28 of the fast
    level while the sampler above, which sleeps between samples, saw both runs' seconds alike
    (results/2026-12-03-h200-table8); whether a thread that keeps running sees the slow level
    as often as one that wakes every few seconds is what this window measures."""
    runs = back_to_back(seconds)
    low = min(runs)
    return {"busy_first_ms": round(runs[0] * 1e3, 4),
            "busy_mean_ms": round(sum(runs) / len(runs) * 1e3, 4),
            "busy_min_ms": round(low * 1e3, 4),
            "busy_slow_share": round(sum(r > SLOW * low for r in runs) / len(runs), 4),
            "busy_runs": len(runs)}


def _quantile(xs: list[float], q: float) -> float:
    """The value at fraction q of xs sorted (nearest rank, no interpolation)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _ms(x: float) -> float:
    return round(x * 1e3, 4)


def run_stats(runs: list[float]) -> dict[str, float]:
    """Median, p90, mean and fastest of runs (seconds) in ms, and their count."""
    return {"runs": len(runs), "med_ms": _ms(_quantile(runs, 0.5)),
            "p90_ms": _ms(_quantile(runs, 0.9)), "mean_ms": _ms(sum(runs) / len(runs)),
            "min_ms": _ms(min(runs))}


def parts_stats(runs: dict[str, list[float]]) -> dict[str, object]:
    """An entry's "parts": the rounds run, and per part its fastest and median ms."""
    out: dict[str, object] = {"runs": min((len(r) for r in runs.values()), default=0)}
    for name, r in runs.items():
        if r:
            out[name] = {"min_ms": _ms(min(r)), "med_ms": _ms(_quantile(r, 0.5))}
    return out


def gap_s(duty: float, burst_s: float) -> float:
    """The idle gap after a burst of burst_s that makes the thread busy ``duty`` (0-1] of the
    time: burst / (burst + gap) = duty."""
    return burst_s * (1.0 - duty) / duty


def bursts(duty: float, seconds: float, burst_s: float) -> tuple[list[list[float]], list[float]]:
    """The reference in bursts of ``burst_s`` (whole runs, at least one a burst) and idle gaps
    making the thread busy ``duty`` of the time, for ``seconds`` of wall: each burst's runs in
    CPU seconds, and every run's wall seconds. At duty 1 there is no gap: a thread that never
    sleeps, cut into bursts only to tell a burst's first run from its later ones."""
    gap = gap_s(duty, burst_s)
    out: list[list[float]] = []
    wall: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or not out:
        cur: list[float] = []
        b_end = time.perf_counter() + burst_s
        while time.perf_counter() < b_end or not cur:
            c0, w0 = time.thread_time(), time.perf_counter()
            reference_work()
            cur.append(time.thread_time() - c0)
            wall.append(time.perf_counter() - w0)
        out.append(cur)
        if gap > 0:
            time.sleep(gap)
    return out, wall


def duty_stats(duty_pct: float, burst_lists: list[list[float]], wall: list[float],
               burst_s: float, low: float | None = None) -> dict[str, float]:
    """One duty's object of a sweep row: run_stats of every run, the medians of the bursts'
    first runs and of their later runs (burst-then-slow shows as first < rest), the wall time's
    median, the burst and gap as run, and the share of runs at the fast level ("fast_share":
    under SLOW x ``low``, the sweep's fastest run, where given: with two levels the median
    follows whichever holds half the runs, the share says how they split)."""
    runs = [r for b in burst_lists for r in b]
    rest = [r for b in burst_lists for r in b[1:]]
    row: dict[str, float] = {"duty": duty_pct, "burst_ms": round(burst_s * 1e3, 3),
                             "gap_ms": round(gap_s(duty_pct / 100, burst_s) * 1e3, 3),
                             "bursts": len(burst_lists), **run_stats(runs),
                             "first_med_ms": _ms(_quantile([b[0] for b in burst_lists], 0.5)),
                             "wall_med_ms": _ms(_quantile(wall, 0.5))}
    if rest:
        row["rest_med_ms"] = _ms(_quantile(rest, 0.5))
    if low is not None:
        row["fast_share"] = round(sum(r < SLOW * low for r in runs) / len(runs), 4)
    return row


def duty_sweep(duties: list[float], seconds: float, burst_s: float) -> list[dict[str, float]]:
    """Each duty (percent) for ``seconds`` in two halves, the duties in the order given and then
    reversed (ABBA: a drift over the sweep lands on every duty alike); one object a duty."""
    got: dict[float, tuple[list[list[float]], list[float]]] = {d: ([], []) for d in duties}
    for d in list(duties) + list(reversed(duties)):
        b, w = bursts(d / 100, seconds / 2, burst_s)
        got[d][0].extend(b)
        got[d][1].extend(w)
    low = min(r for b, _ in got.values() for burst in b for r in burst)
    return [duty_stats(d, *got[d], burst_s, low) for d in duties]


def per_cpu(seconds: float, parts_s: float = 0.0) -> list[dict[str, object]]:
    """The reference back to back ``seconds`` pinned to each CPU this thread may run on, in
    turn (the thread's affinity put back after): per CPU its first run, run_stats, and the share
    of its runs at the fast level (under SLOW x the fastest run on any CPU); with ``parts_s``,
    then PARTS for that long on the same CPU ("parts": parts_stats). Empty where the OS cannot
    pin."""
    if not hasattr(os, "sched_setaffinity"):
        return []
    allowed = sorted(os.sched_getaffinity(0))
    got: list[tuple[int, list[float], dict[str, list[float]] | None]] = []
    try:
        for cpu in allowed:
            os.sched_setaffinity(0, {cpu})
            runs = back_to_back(seconds)
            got.append((cpu, runs, parts_back_to_back(parts_s) if parts_s > 0 else None))
    finally:
        os.sched_setaffinity(0, set(allowed))
    low = min(r for _, runs, _ in got for r in runs)
    out: list[dict[str, object]] = []
    for cpu, runs, parts in got:
        row: dict[str, object] = {
            "cpu": cpu, "first_ms": _ms(runs[0]), **run_stats(runs),
            "fast_share": round(sum(r < SLOW * low for r in runs) / len(runs), 4)}
        if parts is not None:
            row["parts"] = parts_stats(parts)
        out.append(row)
    return out


def _thread_stat(path: Path) -> tuple[str, int, float] | None:
    """(name, last CPU, user+system CPU seconds) from a /proc/PID/task/TID/stat; None when the
    thread is gone. The name sits in parentheses and may hold spaces and ')', so the fields are
    counted from the last ')': field 3 (state) is the first after it, 14-15 utime and stime,
    39 the processor it last ran on."""
    try:
        text = path.read_text()
    except OSError:
        return None
    close = text.rfind(")")
    rest = text[close + 2:].split()
    if close < 0 or len(rest) < 37:
        return None
    name = text[text.find("(") + 1:close]
    return name, int(rest[36]), (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def matching_pids(texts: list[str], root: Path = Path("/proc")) -> list[int]:
    """Processes (not this one) whose command line holds one of ``texts``, case-insensitive."""
    out = []
    needles = [t.lower() for t in texts if t]
    for d in root.iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in cmd.lower() for n in needles):
            out.append(int(d.name))
    return sorted(out)


class ThreadWatch:
    """The busy threads of matching processes between two calls (the module's docstring)."""

    def __init__(self, texts: list[str], root: Path = Path("/proc")) -> None:
        self.texts = texts
        self.root = root
        self.last: dict[tuple[int, int], float] = {}
        self.t = time.perf_counter()

    def busy(self, least_share: float = 0.01) -> list[dict[str, object]]:
        """Threads that used at least ``least_share`` of a core since the last call (on the
        first call: since they started), busiest first."""
        now = time.perf_counter()
        span = max(now - self.t, 1e-3)
        seen: dict[tuple[int, int], float] = {}
        rows: list[dict[str, object]] = []
        for pid in matching_pids(self.texts, self.root):
            try:
                tids = [int(t.name) for t in (self.root / str(pid) / "task").iterdir()]
            except OSError:
                continue
            for tid in tids:
                st = _thread_stat(self.root / str(pid) / "task" / str(tid) / "stat")
                if st is None:
                    continue
                name, cpu, used = st
                seen[(pid, tid)] = used
                delta = used - self.last.get((pid, tid), 0.0)
                if delta >= least_share * span:
                    rows.append({"pid": pid, "tid": tid, "name": name, "cpu": cpu,
                                 "cpu_s": round(delta, 3)})
        self.last, self.t = seen, now
        return sorted(rows, key=lambda r: -float(str(r["cpu_s"])))


def pinned(cpus: list[int], ms: float, parts_ms: float = 0.0) -> list[dict[str, object]]:
    """The reference back to back for ``ms`` pinned to each of ``cpus`` in turn (those this
    thread may use), affinity put back after: cpu, runs, fastest and median ms; with
    ``parts_ms``, then PARTS for that long on the same CPU ("parts": parts_stats)."""
    if not hasattr(os, "sched_setaffinity"):
        return []
    allowed = os.sched_getaffinity(0)
    out: list[dict[str, object]] = []
    try:
        for cpu in cpus:
            if cpu not in allowed:
                continue
            os.sched_setaffinity(0, {cpu})
            runs = back_to_back(ms / 1e3)
            row: dict[str, object] = {"cpu": cpu, "runs": len(runs), "min_ms": _ms(min(runs)),
                                      "med_ms": _ms(_quantile(runs, 0.5))}
            if parts_ms > 0:
                row["parts"] = parts_stats(parts_back_to_back(parts_ms / 1e3))
            out.append(row)
    finally:
        os.sched_setaffinity(0, allowed)
    return out


def busiest_cpus(threads: list[dict[str, object]], most: int = 3) -> list[int]:
    """The distinct CPUs the busiest threads last ran on, busiest first, at most ``most``."""
    out: list[int] = []
    for t in threads:
        cpu = int(str(t["cpu"]))
        if cpu not in out:
            out.append(cpu)
    return out[:most]


def sweep(args: argparse.Namespace, tag: str) -> dict[str, object]:
    """The sweep's fields of a row (the module's docstring)."""
    t0 = time.perf_counter()
    row: dict[str, object] = {"sweep": tag}
    if args.duty:
        row["duty"] = duty_sweep(args.duty, args.duty_seconds, args.burst_ms / 1e3)
    if args.per_cpu > 0:
        row["per_cpu"] = per_cpu(args.per_cpu, args.per_cpu * args.parts_share)
    row["sweep_s"] = round(time.perf_counter() - t0, 3)
    return row


def duties(text: str) -> list[float]:
    """'10,25,50' -> [10.0, 25.0, 50.0]; each in (0, 100]; empty text -> []."""
    out = [float(x) for x in text.split(",") if x.strip()]
    if any(not 0 < d <= 100 for d in out):
        raise argparse.ArgumentTypeError(f"a duty is a percent in (0, 100]: {text}")
    return out


class LineWatch:
    """New lines of a file that contain a text: the lines there when it started do not count
    (the file need not exist yet)."""

    def __init__(self, path: str | None, match: str) -> None:
        self.path = Path(path) if path else None
        self.match = match
        self.seen = len(self._lines())

    def _lines(self) -> list[str]:
        if self.path is None:
            return []
        try:
            return [ln for ln in self.path.read_text(errors="replace").splitlines()
                    if self.match in ln]
        except OSError:
            return []

    def new(self) -> list[str]:
        lines = self._lines()
        fresh = lines[self.seen:]
        self.seen = len(lines)
        return fresh


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--samples", type=int, default=0, help="stop after N samples (0: never)")
    ap.add_argument("--busy", type=float, default=0.0,
                    help="after each sample, run the reference back to back this many seconds "
                         "(a thread that never sleeps) and report its mean and slow share")
    ap.add_argument("--busy-every", type=int, default=1, metavar="N",
                    help="the --busy window after every Nth sample only (the first included): "
                         "a sampler every second keeps the busy thread's share of a 5 s one")
    ap.add_argument("--duty", type=duties, default=[],
                    help="duty-cycle sweep: the reference in bursts at these percents of busy "
                         "time, e.g. 10,25,50,75,100 (empty: no sweep)")
    ap.add_argument("--duty-seconds", type=float, default=2.0, help="seconds at each duty")
    ap.add_argument("--burst-ms", type=float, default=3.0, help="a burst's length (ms)")
    ap.add_argument("--per-cpu", type=float, default=0.0,
                    help="seconds of the reference pinned to each allowed CPU in a sweep (0: none)")
    ap.add_argument("--sweep-at-start", action="store_true", help="sweep at the first sample")
    ap.add_argument("--sweep-on", metavar="FILE", help="sweep after each new line of FILE "
                    "containing --sweep-match (lines there at start do not count)")
    ap.add_argument("--sweep-match", default="ready=1", help="the text --sweep-on looks for")
    ap.add_argument("--tag", default="start", help="the sweep field of --sweep-at-start's row")
    ap.add_argument("--threads-match", default="", metavar="TEXTS",
                    help="comma-separated texts: record the busy threads (and their CPUs) of "
                         "processes whose command line holds one (empty: none)")
    ap.add_argument("--pin-ms", type=float, default=0.0,
                    help="with --threads-match: ms of the reference pinned to each CPU the "
                         "busiest threads ran on, every sample (0: none)")
    ap.add_argument("--parts-share", type=float, default=PARTS_SHARE, metavar="F",
                    help="after the reference on each CPU of --per-cpu and --pin-ms, time its "
                         "parts (json, pickle, sha256) and a plain loop for F x that time "
                         "(0: none)")
    args = ap.parse_args()
    if args.parts_share < 0:
        ap.error("--parts-share is a share of the reference's time, 0 or more")
    texts = [t.strip() for t in args.threads_match.split(",") if t.strip()]
    threads = ThreadWatch(texts) if texts else None
    sweeping = bool(args.duty) or args.per_cpu > 0
    watch = LineWatch(args.sweep_on, args.sweep_match)
    last = proc_stat()
    n = 0
    while args.samples <= 0 or n < args.samples:
        cpu, wall = sample()
        now = proc_stat()
        row: dict[str, object] = {"t": round(time.time(), 3), "ref_cpu_ms": round(cpu * 1e3, 4),
                                  "ref_wall_ms": round(wall * 1e3, 4)}
        if last is not None and now is not None and now[0] > last[0]:
            total = now[0] - last[0]
            row["busy"] = round((now[1] - last[1]) / total, 4)
            row["steal"] = round((now[2] - last[2]) / total, 4)
        if threads is not None:
            row["threads"] = busy_rows = threads.busy()
            if args.pin_ms > 0 and busy_rows:
                row["pinned"] = pinned(busiest_cpus(busy_rows), args.pin_ms,
                                       args.pin_ms * args.parts_share)
        windowed = args.busy > 0 and n % max(1, args.busy_every) == 0
        if windowed:
            row.update(busy(args.busy))
        tags = ([args.tag] if args.sweep_at_start and n == 0 else []) + watch.new()
        if sweeping and tags:
            row.update(sweep(args, " | ".join(tags)))
        last = proc_stat() if windowed or "sweep" in row else now
        print(json.dumps(row), flush=True)
        n += 1
        if args.samples <= 0 or n < args.samples:
            time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
