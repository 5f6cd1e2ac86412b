"""How steady `probe --measure`'s host timing is: the same timing (launcher/probe/hostcost.py
``time_host`` over the installed vLLM's functions, launcher/probe/vllmfront.py) run N times, each
run's four terms and the speed the planner takes from them (hardware.host_profile: the geometric
mean of the way-in and way-out ratios against the lent H200 host), then each term's spread (the
largest run over the smallest). With ``--busy K``, the second half of the runs time with K
CPU-bound processes beside them (each a Python loop this script starts, bounded by its own
deadline and ended by its pid), as a machine busy with other work would.

    flock /tmp/toposerve-heavy.lock .venv/bin/python benchmarks/host_cost_spread.py -n 8 --busy 1
    flock /tmp/toposerve-heavy.lock .venv/bin/python benchmarks/host_cost_spread.py -n 6 --fresh

In process by default (vLLM imported once, ~20 s on two cores); ``--fresh`` runs each timing in
a worker process of its own, exactly as `probe --measure` does (``python -m
launcher.probe.vllmfront``), so that first-call effects are in every run. Each record is kept as
the probe keeps it (``hostcost.save``, in a temporary cache), so its reason line also says where
its reference workload ran slower than in the run before.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from launcher.model.tinymodel import ensure_tiny_model
from launcher.pipeline.hostcosts import key_here
from launcher.planner import hardware
from launcher.probe import hostcost

TERMS = ("prompt_token_s", "request_s", "step_s", "seq_step_s")
# the busy processes' own bound: never left running past this, whatever happens to this script
BUSY_DEADLINE_S = 600.0


def _busy(k: int) -> list[subprocess.Popen[bytes]]:
    loop = f"import time\nend = time.time() + {BUSY_DEADLINE_S}\nwhile time.time() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(k)]


def _speed(rec: hostcost.HostTiming) -> tuple[float, float, float]:
    way_in = rec.prompt_token_s / hardware.H200_HOST_TOKEN_TIMED_S
    way_out = rec.seq_step_s / hardware.H200_HOST_SEQ_TIMED_S
    return way_in, way_out, math.sqrt(way_in * way_out)


def _fresh(tok: str) -> hostcost.HostTiming:
    argv = [sys.executable, "-m", "launcher.probe.vllmfront", tok, json.dumps(asdict(key_here()))]
    got = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300)
    return hostcost.parse(got.stdout.strip().splitlines()[-1])


def _spread(recs: list[hostcost.HostTiming]) -> str:
    parts = []
    for term in TERMS:
        vals = [getattr(r, term) for r in recs]
        parts.append(f"{term} x{max(vals) / min(vals):.2f}")
    speeds = [_speed(r)[2] for r in recs]
    parts.append(f"speed x{max(speeds) / min(speeds):.2f} "
                 f"({min(speeds):.3f}-{max(speeds):.3f}, median {statistics.median(speeds):.3f})")
    return ", ".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=8, help="timings (default 8)")
    p.add_argument("--busy", type=int, default=0,
                   help="CPU-bound processes beside the second half of the timings")
    p.add_argument("--fresh", action="store_true", help="each timing in a worker process")
    args = p.parse_args()
    tok = str(ensure_tiny_model())
    fe = None
    if not args.fresh:
        from launcher.probe.vllmfront import VllmFrontEnd
        fe = VllmFrontEnd(tok)
    key = key_here()
    print(f"{key.cpu}, {key.cores} cores, vLLM {key.vllm}; {args.n} timings"
          f"{' (fresh workers)' if args.fresh else ' (one process)'}")
    print(f"{'run':>3} {'busy':>4} {'us/tok':>7} {'req us':>7} {'step us':>7} {'seq us':>7} "
          f"{'in':>5} {'out':>5} {'speed':>6} {'wall s':>6}  steadiness")
    runs: dict[int, list[hostcost.HostTiming]] = {0: [], args.busy: []}
    cache = Path(tempfile.mkdtemp(prefix="host-cost-spread-"))
    for i in range(args.n):
        load = args.busy if args.busy and i >= args.n // 2 else 0
        procs = _busy(load)
        try:
            t = time.perf_counter()
            rec = _fresh(tok) if fe is None else hostcost.time_host(fe, key)
            wall = time.perf_counter() - t
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        hostcost.save(cache, rec)
        rec = hostcost.load(cache, rec.key) or rec
        runs[load].append(rec)
        way_in, way_out, speed = _speed(rec)
        note = getattr(rec, "steadiness_note", None)
        print(f"{i:>3} {load:>4} {rec.prompt_token_s * 1e6:7.3f} {rec.request_s * 1e6:7.1f} "
              f"{rec.step_s * 1e6:7.1f} {rec.seq_step_s * 1e6:7.1f} {way_in:5.2f} {way_out:5.2f} "
              f"{speed:6.3f} {wall:6.2f}  {note() if note else '(format 1: not measured)'}")
    shutil.rmtree(cache, ignore_errors=True)
    for load, recs in runs.items():
        if recs:
            print(f"spread, {len(recs)} runs with {load} busy process(es): {_spread(recs)}")


if __name__ == "__main__":
    main()
