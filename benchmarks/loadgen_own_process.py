"""loadgen's closed-loop run at many streams measured inside the caller's process (loadgen.api
run, as tests/launcher/test_cpu_prediction.py does) against `python -m loadgen --json` as a
process of its own (as a user runs it), on the same engine, the two ways alternating in order
round by round; beside them a witness, a process of its own that only sleeps 10 ms at a time
and notes each wake-up later than 50 ms, so that a late loop that every process on the machine
saw is told from one of loadgen's own.

    flock /tmp/toposerve-heavy.lock .venv/bin/python benchmarks/loadgen_own_process.py \\
        --url http://127.0.0.1:8000 [--key KEY] [--rounds 6] [--concurrency 8]

The URL is a vLLM CPU engine serving the embedded tiny model (`launcher serve` runs one; its key
is TOPOSERVE_ENGINE_API_KEY). Per run: output tok/s, the engine's own mean step over the run
(vllm:inter_token_latency, stamped in its engine core), the output as a share of the streams at
that step, loadgen's own loop lag and the witness's longest late wake-up over the run.

On this 2-core machine (2026-12-05, helper 108; 8 streams; 17 runs each way in the stack test's
process on its engine with `probe --measure` timing it before each round, and 6 each way by this
script against a `launcher serve` engine): in-process 1341-1914 tok/s, own process 1349-1899;
the engine's own step 3.89-5.66 and 3.92-5.63 ms; output 0.89-0.995 and 0.92-0.95 of 8 streams
at that step, mean 0.940 both ways: the output moves with the engine's own step, whichever
process measures it. loadgen's loop was late by over 100 ms in 12 and 7 of 23 runs (at most 880
and 948 ms); of the 24 runs with the witness beside them, each of the 10 such runs had the
witness late as long at the same seconds (0.15-1.15 s; /proc/stat's steal ~0), and the witness
was late so also while `probe --measure` timed the engine: the late loops are the machine's
(any process beside the engine's spinning threads waits up to a second for a core), not the
caller's process, and those runs' output was 0.92-0.95 of the streams at the engine's step, as
in the others. The stack test's in-process loadgen was kept for that reason.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from loadgen.api import run as loadgen_run
from loadgen.config import Config

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.vllmmetrics import engine_step_totals  # noqa: E402

# the witness's own bound: never left running past this, whatever happens to this script
WITNESS_DEADLINE_S = 1800.0
WITNESS = f"""import sys, time
end = time.time() + {WITNESS_DEADLINE_S}
while time.time() < end:
    t = time.perf_counter()
    time.sleep(0.010)
    late = time.perf_counter() - t - 0.010
    if late > 0.05:
        print(f"{{time.time():.3f}} {{late:.3f}}", flush=True)
"""


@dataclass(frozen=True)
class Run:
    way: str  # "in-process" or "own process"
    output_tok_s: float
    engine_step_s: float  # the engine's own mean step over the run
    loop_lag_s: float  # loadgen's loop, its latest wake-up
    start: float  # time.time() around the run, to find the witness's wake-ups in it
    end: float


def in_process(url: str, key: str | None, streams: int, warm: bool) -> tuple[float, float]:
    cfg = Config(url=url, api_key=key, concurrency=streams, warmup=None if warm else 0,
                 progress=False)
    summary = loadgen_run(cfg).levels[0].summary
    assert summary.requests_ok == cfg.requests_for(streams), summary.failures
    lag = summary.loop.lag_s.max if summary.loop is not None else None
    return summary.output_tok_s or 0.0, lag or 0.0


def own_process(url: str, key: str | None, streams: int, warm: bool,
                out: Path) -> tuple[float, float]:
    argv = [sys.executable, "-m", "loadgen", "--url", url, "--concurrency", str(streams),
            "--json", str(out), "--no-progress", *([] if warm else ["--no-warmup"])]
    env = {**os.environ, **({"TOPOSERVE_API_KEY": key} if key else {})}  # not on the command line
    subprocess.run(argv, capture_output=True, check=True, timeout=600, env=env)
    summary = json.loads(out.read_text())["summary"]
    loop = summary["loop"]
    return summary["output_tok_s"], loop["lag_s"]["max"] if loop else 0.0


def one_run(way: str, url: str, key: str | None, streams: int, warm: bool, tmp: Path) -> Run:
    before, start = engine_step_totals(url), time.time()
    if way == "in-process":
        output, lag = in_process(url, key, streams, warm)
    else:
        output, lag = own_process(url, key, streams, warm, tmp / "run.json")
    end, after = time.time(), engine_step_totals(url)
    step = (after[0] - before[0]) / max(1.0, after[1] - before[1])
    return Run(way, output, step, lag, start, end)


def witness_late(path: Path, run: Run) -> float:
    """The witness's latest wake-up within the run's seconds (0: none later than 50 ms)."""
    lates = [float(late) for t, late in (line.split() for line in path.read_text().splitlines())
             if run.start <= float(t) <= run.end]
    return max(lates, default=0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--key", default=os.environ.get("TOPOSERVE_ENGINE_API_KEY"))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=8)
    args = p.parse_args()
    url = args.url.rstrip("/")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        log = tmp / "witness.txt"
        with log.open("w") as out:
            witness = subprocess.Popen([sys.executable, "-c", WITNESS], stdout=out)
        try:
            for i in range(args.rounds):
                # each way first in every other round: a drift over the rounds falls on both
                order = ("in-process", "own process")[:: 1 if i % 2 == 0 else -1]
                for j, way in enumerate(order):
                    # loadgen's default warm-up in the first round only, as the test does
                    r = one_run(way, url, args.key, args.concurrency, i == 0 and j == 0, tmp)
                    runs.append(r)
                    share = r.output_tok_s * r.engine_step_s / args.concurrency
                    print(f"round {i + 1} {way}: {r.output_tok_s:.0f} tok/s, the engine's own "
                          f"step {r.engine_step_s * 1e3:.2f} ms, output {share:.3f} of "
                          f"{args.concurrency} streams at that step; loadgen's loop late by at "
                          f"most {r.loop_lag_s * 1e3:.0f} ms, the witness "
                          f"{witness_late(log, r) * 1e3:.0f} ms", flush=True)
        finally:
            witness.kill()  # our own child, by its pid
            witness.wait()
        for way in ("in-process", "own process"):
            mine = [r for r in runs if r.way == way]
            shares = [r.output_tok_s * r.engine_step_s / args.concurrency for r in mine]
            print(f"{way}: {len(mine)} runs, {min(r.output_tok_s for r in mine):.0f}-"
                  f"{max(r.output_tok_s for r in mine):.0f} tok/s, the engine's step "
                  f"{min(r.engine_step_s for r in mine) * 1e3:.2f}-"
                  f"{max(r.engine_step_s for r in mine) * 1e3:.2f} ms, output {min(shares):.3f}-"
                  f"{max(shares):.3f} (mean {statistics.mean(shares):.3f}) of the streams at "
                  f"that step; loop late over 100 ms in "
                  f"{sum(r.loop_lag_s > 0.1 for r in mine)}, the witness in "
                  f"{sum(witness_late(log, r) > 0.1 for r in mine)}")


if __name__ == "__main__":
    main()
