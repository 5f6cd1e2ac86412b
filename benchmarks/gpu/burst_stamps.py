"""A served case's c32 bursts, request by request, from the stamps of vLLM's front end and engine
core (issue22-case.sh STAMPS=1: benchmarks/vllm_frontend_order/stamps.py, its ev-PID.jsonl rows)
beside loadgen's sends: where the ~15 requests that one step takes in come together
(docs/planner.md, "The 32-stream burst's first wave, measured against the simulation").

    python benchmarks/gpu/burst_stamps.py CASE_DIR [--min 8] [--gap-ms 5] [--rows N]

CASE_DIR: the case's result folder (its tgz unpacked), holding ev-*.jsonl. Per burst (requests
reaching the API server within --gap-ms of the one before; --min of them at least), ms from the
burst's first loadgen send (its first arrival where loadgen's record is missing), one row a
request in the order of arrival:
  lg     loadgen's send (rank-matched: the k-th send from 50 ms before the burst's first arrival
         to its last beside its k-th arrival, where they are as many; the proxy stands between,
         with no shared id)
  app    its ASGI entry in the API server; add0 AsyncLLM.add_request's start
  zmq1   the end of its send to the engine core (AsyncMPClient.add_request_async)
  recv   the engine core's input thread decoding it (EngineCore.preprocess_add_request)
  eadd   the busy loop adding it (EngineCore.add_request)
  step   the schedule that took it in: its number in the burst (0: the first schedule that
         started after the burst's first arrival) @ its start
  tok1   the first body of its stream leaving the API server; lgtok1 loadgen's first token
Then the burst's schedules (start, tokens, new requests, requests scheduled) to the last that
took one of its requests in, and the spans (first..last) of each stage over the requests of its
biggest step: where those spans shrink from one stage to the next is where they bunched.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))  # jsonl_rows, when loaded by path (tests)
from jsonl_rows import read_rows

STAGES = ("app", "body", "create", "add0", "add1", "zmq0", "zmq1", "send1", "done")


@dataclass(frozen=True)
class Event:
    t: float  # CLOCK_MONOTONIC, s
    name: str
    args: tuple[Any, ...]
    pid: int


def parse_lines(lines: Iterable[str], pid: int) -> tuple[list[Event], int]:
    """The rows of one ev-PID.jsonl and the count of lines that are not a row (a line cut by a
    killed process, garbage): skipped, never fatal."""
    return read_rows(lines, lambda row: _event(row, pid))


def _event(row: object, pid: int) -> Event | None:
    """A row ``[t, name, *args]`` with a finite number t; None for any other JSON value."""
    if (not isinstance(row, list) or len(row) < 2 or not isinstance(row[1], str)
            or isinstance(row[0], bool) or not isinstance(row[0], (int, float))
            or not math.isfinite(row[0])):
        return None
    return Event(float(row[0]), row[1], tuple(row[2:]), pid)


def load(folder: Path) -> tuple[list[Event], int]:
    events: list[Event] = []
    bad = 0
    for f in sorted(folder.glob("ev-*.jsonl")):
        try:
            pid = int(f.stem.split("-", 1)[1])
        except ValueError:
            pid = -1
        ev, b = parse_lines(f.read_text(errors="replace").splitlines(), pid)
        events += ev
        bad += b
    events.sort(key=lambda e: e.t)
    return events, bad


@dataclass
class Request:
    pid: int
    key: int
    at: dict[str, float] = field(default_factory=dict)
    rid: str | None = None


@dataclass(frozen=True)
class Step:
    start: float
    tokens: int
    new: tuple[str, ...]
    running: int | None


@dataclass
class Record:
    requests: list[Request]
    recv: dict[str, float]
    eadd: dict[str, float]
    steps: list[Step]
    sends: list[tuple[float, float | None]]  # loadgen's (send, first token), monotonic
    notes: list[str]


def build(events: Sequence[Event], lg_match: str = "c32") -> Record:
    reqs: dict[tuple[int, int], Request] = {}
    recv: dict[str, float] = {}
    eadd: dict[str, float] = {}
    steps: list[Step] = []
    sends: list[tuple[float, float | None]] = []
    notes: list[str] = []
    patched: list[str] = []
    for e in events:
        a = e.args
        try:
            if e.name == "app":
                reqs[(e.pid, int(a[0]))] = Request(e.pid, int(a[0]), {"app": e.t})
            elif e.name in STAGES and a and a[0] is not None and (e.pid, int(a[0])) in reqs:
                r = reqs[(e.pid, int(a[0]))]
                r.at.setdefault(e.name, e.t)
                if e.name == "zmq0" and len(a) > 1:
                    r.rid = str(a[1])
            elif e.name == "erecv":
                recv.setdefault(str(a[0]), e.t)
            elif e.name == "eadd":
                eadd.setdefault(str(a[0]), e.t)
            elif e.name == "sched":
                steps.append(Step(float(a[0]), int(a[1]), tuple(str(x) for x in a[2]),
                                  int(a[3]) if len(a) > 3 else None))
            elif e.name == "lgreq":
                # [perf_counter now, argv, [[index, sent, first, done], ...]] (perf_counter)
                if any(lg_match in str(w) for w in a[1]):
                    shift = e.t - float(a[0])
                    sends = [(float(s) + shift, None if f is None else float(f) + shift)
                             for _, s, f, _ in a[2]]
            elif e.name == "patched":
                patched.append(str(a[0]))
            elif e.name in ("patchfail", "stampfail"):
                notes.append(f"{e.name} (pid {e.pid}): {' '.join(str(x) for x in a)}")
            elif e.name == "gate":
                notes.append(f"gate {'open' if a[0] else 'shut'} (pid {e.pid}) at {e.t:.3f}")
        except (IndexError, TypeError, ValueError, OverflowError):
            notes.append(f"unreadable {e.name} row (pid {e.pid}): {list(a)!r:.120}")
    notes.insert(0, f"hooks taken: {', '.join(sorted(set(patched))) or 'none'}")
    steps.sort(key=lambda s: s.start)
    return Record(sorted(reqs.values(), key=lambda r: r.at["app"]), recv, eadd, steps,
                  sorted(sends), notes)


def clusters(times: Sequence[float], gap_s: float) -> list[list[int]]:
    """Indices of sorted times, split where one is more than gap_s after the one before."""
    out: list[list[int]] = []
    for i, t in enumerate(times):
        if out and t - times[i - 1] <= gap_s:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _ms(t: float | None, t0: float) -> str:
    return "-" if t is None else f"{1e3 * (t - t0):.1f}"


def _span(ts: Sequence[float | None], t0: float) -> str:
    v = [t for t in ts if t is not None]
    return "-" if not v else f"{_ms(min(v), t0)}..{_ms(max(v), t0)}"


def report(rec: Record, min_size: int = 8, gap_ms: float = 5.0, rows: int = 40) -> list[str]:
    out = list(rec.notes)
    if not rec.requests:
        return [*out, "no request stamped (the gate never opened, or no hook in the API server)"]
    arrivals = [r.at["app"] for r in rec.requests]
    step_of: dict[str, int] = {}
    for i, s in enumerate(rec.steps):
        for rid in s.new:
            step_of.setdefault(rid, i)
    small = 0
    for n, group in enumerate(clusters(arrivals, gap_ms / 1e3)):
        if len(group) < min_size:
            small += 1
            continue
        burst = [rec.requests[i] for i in group]
        first = burst[0].at["app"]
        # loadgen's sends from 50 ms before the burst's first arrival to its last, when they are
        # as many as its arrivals
        last = burst[-1].at["app"]
        lg = [i for i, (s, _) in enumerate(rec.sends) if first - 0.05 <= s <= last] or None
        if lg is not None and len(lg) != len(burst):
            lg = None
        t0 = rec.sends[lg[0]][0] if lg else first
        s0 = next((i for i, s in enumerate(rec.steps) if s.start >= first), len(rec.steps))
        out.append("")
        out.append(f"burst {n}: {len(burst)} requests, ms from "
                   f"{'its first loadgen send' if lg else 'its first arrival (no loadgen match)'}")
        out.append(f"{'#':>3} {'lg':>7} {'app':>7} {'add0':>7} {'zmq1':>7} {'recv':>7} "
                   f"{'eadd':>7} {'step':>12} {'tok1':>7} {'lgtok1':>7}")
        last_step = s0
        for k, r in enumerate(burst):
            st = step_of.get(r.rid or "")
            if st is not None:
                last_step = max(last_step, st)
            step = "-" if st is None else f"{st - s0}@{_ms(rec.steps[st].start, t0)}"
            lgs, lgf = rec.sends[lg[k]] if lg else (None, None)
            if k < rows:
                out.append(f"{k:>3} {_ms(lgs, t0):>7} {_ms(r.at.get('app'), t0):>7} "
                           f"{_ms(r.at.get('add0'), t0):>7} {_ms(r.at.get('zmq1'), t0):>7} "
                           f"{_ms(rec.recv.get(r.rid or ''), t0):>7} "
                           f"{_ms(rec.eadd.get(r.rid or ''), t0):>7} {step:>12} "
                           f"{_ms(r.at.get('send1'), t0):>7} {_ms(lgf, t0):>7}")
        mine = {r.rid for r in burst}
        out.append("  steps: " + "  ".join(
            f"{i - s0}@{_ms(s.start, t0)}:{s.tokens}t/{sum(x in mine for x in s.new)}new"
            + ("" if s.running is None else f"/{s.running}")
            for i, s in enumerate(rec.steps[s0:last_step + 1], start=s0)))
        counts: dict[int, list[Request]] = {}
        for r in burst:
            st = step_of.get(r.rid or "")
            if st is not None:
                counts.setdefault(st, []).append(r)
        if counts:
            big, grp = max(counts.items(), key=lambda kv: len(kv[1]))
            out.append(
                f"  step {big - s0}'s {len(grp)}: app {_span([r.at.get('app') for r in grp], t0)}"
                f"  zmq1 {_span([r.at.get('zmq1') for r in grp], t0)}"
                f"  recv {_span([rec.recv.get(r.rid or '') for r in grp], t0)}"
                f"  eadd {_span([rec.eadd.get(r.rid or '') for r in grp], t0)}"
                f"  step {_ms(rec.steps[big].start, t0)}")
    if small:
        out.append(f"({small} groups of fewer than {min_size} arrivals left out)")
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--min", type=int, default=8, help="fewest arrivals a burst (default 8)")
    p.add_argument("--gap-ms", type=float, default=5.0, help="a burst's arrivals' largest gap")
    p.add_argument("--rows", type=int, default=40, help="request rows shown a burst")
    p.add_argument("--loadgen", default="c32", help="the loadgen run whose argv holds this")
    a = p.parse_args(argv)
    events, bad = load(a.folder)
    if not events:
        print(f"no ev-*.jsonl rows under {a.folder}", file=sys.stderr)
        return 1
    rec = build(events, a.loadgen)
    if bad:
        rec.notes.append(f"{bad} unreadable lines skipped")
    print("\n".join(report(rec, a.min, a.gap_ms, a.rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
