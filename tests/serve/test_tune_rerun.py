"""`launcher tune`'s re-run of overlapping finalists, on cue.

Whether two real vLLM CPU candidates' intervals overlap is up to the machine, so the live test
(test_tune.py) runs with --reruns 0. Here every start is a real one (the proxy and the stand-in
engine of tests/serve/standin_engine.py, through TOPOSERVE_ENGINE_CMD), and only loadgen's
scores are scripted, so that the two candidates overlap: each finalist is started a second
time, its rounds pooled with the first start's, and the plan records all of them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.cli import cmd_tune
from launcher.cli.main import build_parser
from launcher.engine.launchspec import LaunchSpec
from launcher.engine.supervise import free_port

STANDIN = Path(__file__).with_name("standin_engine.py")
# Per candidate, its rounds' scores in the order measured: wide enough that neither interval
# is clear of the other after the first start, so both finalists are re-run.
SCORES = {"default": [100.0, 140.0, 120.0, 130.0],
          "small-prefill-chunks": [110.0, 150.0, 125.0, 135.0]}


def scripted_loadgen(calls: list[tuple[str, int]]) -> Any:
    def run(spec: LaunchSpec, args: argparse.Namespace, out: Path,
            warmup: int = 0) -> tuple[int, str]:
        name = out.name.split("-start")[0]
        score = SCORES[name][sum(1 for n, _ in calls if n == name)]
        calls.append((name, warmup))
        rows = [{"ttft_s": 0.1, "e2e_s": 0.4, "completion_tokens": args.gen, "error": None}
                for _ in range(args.requests)]
        summary = {"requests_ok": args.requests, "requests_failed": 0,
                   "output_tok_s": score, "duration_s": 1.0}
        out.write_text(json.dumps({"summary": summary, "requests": rows}))
        return 0, ""

    return run


def test_overlapping_finalists_are_started_again_and_their_rounds_pooled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("TOPOSERVE_ENGINE_CMD", f"{sys.executable} {STANDIN}")
    monkeypatch.setenv("STANDIN_STATE", str(state))
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(cmd_tune, "run_loadgen", scripted_loadgen(calls))
    out, results = tmp_path / "plan.json", tmp_path / "results"
    args = build_parser().parse_args(
        ["tune", "--port", str(free_port()), "--prompt", "64", "--gen", "16",
         "--concurrency", "2", "--requests", "4", "--repeats", "2", "--warmup", "1",
         "--reruns", "1", "--objective", "throughput", "--out", str(out),
         "--results-dir", str(results), "--log-dir", str(tmp_path / "logs"),
         "--ready-timeout", "120"])
    assert cmd_tune.main(args) == 0
    # two candidates, each started twice: four engine starts, the re-runs leader first
    starts = [json.loads(line) for line in (state / "starts").read_text().splitlines()]
    assert len(starts) == 4
    flags = ["--max-num-batched-tokens" in s["argv"] for s in starts]
    assert flags == [False, True, True, False]
    # the warm-up goes before each start's first round only
    assert calls == [("default", 1), ("default", 0), ("small-prefill-chunks", 1),
                     ("small-prefill-chunks", 0), ("small-prefill-chunks", 1),
                     ("small-prefill-chunks", 0), ("default", 1), ("default", 0)]
    assert sorted(p.name for p in results.glob("*.json")) == sorted(
        f"{name}-start{s}-round{r}.json" for name in SCORES for s in (1, 2) for r in (1, 2))
    tuned = json.loads(out.read_text())["tuned"]
    assert "overlap" in tuned["decision"]
    by_name = {r["candidate"]: r for r in tuned["results"]}
    for name, scores in SCORES.items():
        assert by_name[name]["rounds"] == 4
        assert by_name[name]["scores"] == scores  # the re-run's rounds follow the first's
        assert by_name[name]["score"] == pytest.approx(sum(scores) / 4)
    assert tuned["winner"] == "small-prefill-chunks"
