"""The host's single-thread speed over time, sampled beside a GPU session's steps.

    python benchmarks/gpu/host_speed.py [--interval 5] [--samples 0] [--busy 0]   # JSON lines

Every ``interval`` seconds: the least of 5 runs of the host timing's reference workload
(launcher.probe.hostcost.reference_work: a JSON parse, pickling and sha256 of 4,000 ids, the
figure `probe --measure` records as "reference workload"), in this thread's CPU time and in wall
time, and the whole machine's busy and steal shares since the last sample (/proc/stat).

Why: the sixth table's probe timed its host's reference at 1.00 ms where two other machines of
the same CPU model timed 0.51-0.54 ms, and its engines then served about 1.25x slower than the
shipped host, not 1.9x (docs/planner.md, "Issue 22's sixth table"). Whether the host's speed
moves between the probe and the serving, and whether a hypervisor's steal goes with it, is what
these samples show. One sample costs ~5 ms of one core (0.1% at the default interval), so it
runs beside the engines without moving what they measure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher.probe.hostcost import reference_work

RUNS = 5
# a run this much slower than the busy window's fastest counts as the slow level (the lent H200's
# two levels were ~1.9x apart, nothing between them: results/2026-12-03-h200-table7)
SLOW = 1.4


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


def busy(seconds: float) -> dict[str, float]:
    """The reference back to back for ``seconds`` (a thread that never sleeps, as an engine
    core's does not while it serves): its first run, mean, fastest, and the share of runs at the
    slow level. Why: the eighth table's two host-bound engines ran x0.93 and x1.28 of the fast
    level while the sampler above, which sleeps between samples, saw both runs' seconds alike
    (results/2026-12-03-h200-table8); whether a thread that keeps running sees the slow level
    as often as one that wakes every few seconds is what this window measures."""
    runs: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or not runs:
        c0 = time.thread_time()
        reference_work()
        runs.append(time.thread_time() - c0)
    low = min(runs)
    return {"busy_first_ms": round(runs[0] * 1e3, 4),
            "busy_mean_ms": round(sum(runs) / len(runs) * 1e3, 4),
            "busy_min_ms": round(low * 1e3, 4),
            "busy_slow_share": round(sum(r > SLOW * low for r in runs) / len(runs), 4),
            "busy_runs": len(runs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--samples", type=int, default=0, help="stop after N samples (0: never)")
    ap.add_argument("--busy", type=float, default=0.0,
                    help="after each sample, run the reference back to back this many seconds "
                         "(a thread that never sleeps) and report its mean and slow share")
    args = ap.parse_args()
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
        if args.busy > 0:
            row.update(busy(args.busy))
        last = proc_stat() if args.busy > 0 else now
        print(json.dumps(row), flush=True)
        n += 1
        if args.samples <= 0 or n < args.samples:
            time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
