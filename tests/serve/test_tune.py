"""`launcher tune`: candidate specs, scoring, and a real A/B of two CPU engine settings."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from launcher.cli.cmd_tune import TABLE_WIDTH, comparison, table_notes
from launcher.errors import LauncherError
from launcher.tune.loop import CandidateSpec, Measured, Round, Slo, choose, judge, parse_candidate
from tests.conftest import REPO, free_port
from tests.support import early


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tp=2", CandidateSpec("tp=2", tp=2)),
        ("pp=2 name=layers", CandidateSpec("layers", pp=2)),
        ("tp=2 dp=2", CandidateSpec("tp=2 dp=2", tp=2, dp=2)),
        ("name=small --max-num-batched-tokens 256",
         CandidateSpec("small", vllm_args=("--max-num-batched-tokens", "256"))),
        ("--max-num-seqs 4", CandidateSpec("--max-num-seqs 4", vllm_args=("--max-num-seqs", "4"))),
    ],
)
def test_candidate_specs_parse(text: str, expected: CandidateSpec) -> None:
    assert parse_candidate(text) == expected


@pytest.mark.parametrize("text", ["tp=0", "tp=two", "colour=red", "tp"])
def test_bad_candidate_specs_say_what_is_expected(text: str) -> None:
    with pytest.raises(LauncherError, match=r"tp=N|key=value"):
        parse_candidate(text)


def test_the_table_shows_each_candidates_interval_slo_and_why_one_was_excluded() -> None:
    def rnd(out: float, ttft: float) -> Round:
        rows = tuple({"ttft_s": ttft, "e2e_s": ttft + 0.3, "completion_tokens": 16,
                      "error": None} for _ in range(4))
        return Round({"requests_ok": 4, "requests_failed": 0, "output_tok_s": out,
                      "duration_s": 2.0}, rows)

    slo = Slo(ttft_ms=500)
    ms = [Measured(CandidateSpec("fast-first-token"), (rnd(400, 0.1), rnd(410, 0.1))),
          Measured(CandidateSpec("slow-first-token"), (rnd(900, 0.9), rnd(950, 0.9))),
          Measured(CandidateSpec("broken"), (rnd(999, 0.1),), "vLLM exited 1")]
    verdicts = [judge(m, "slo", 16, slo) for m in ms]
    best = choose(verdicts, "slo", slo)
    console = Console(width=TABLE_WIDTH, record=True)
    console.print(comparison(verdicts, ms, best, "slo", slo))
    text = console.export_text()
    assert "objective slo (TTFT ≤ 500 ms" in text
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.strip().endswith(
        ("best", "excluded"))}
    # mean 405, s = 7.07 over 2 rounds: 405 ± t(0.975, 1) · s / √2 = 405 ± 63.5
    assert "341.5–468.5" in lines["fast-first-token"]
    assert "yes 8/8" in lines["fast-first-token"]
    assert "← best" in lines["fast-first-token"]
    assert "NO 0/8" in lines["slow-first-token"]
    assert "one round" in lines["broken"]
    assert table_notes(verdicts, ms) == [
        "slow-first-token: excluded — misses the SLO: 0 of 8 requests within TTFT ≤ 500 ms "
        "(needs 90%)",
        "broken: excluded — vLLM exited 1",
    ]


@dataclass(frozen=True)
class Tuned:
    returncode: int
    stdout: str
    stderr: str
    out: Path  # the plan tune wrote
    results: Path  # its --results-dir


def begin_tune(tmp_path: Path) -> Tuned:
    """The whole `launcher tune` run of the test below, to its end (it leaves nothing running)."""
    out = tmp_path / "plan.json"
    results = tmp_path / "results"
    argv = [sys.executable, "-m", "launcher", "tune", "--port", str(free_port()),
            "--prompt", "64", "--gen", "16", "--concurrency", "2", "--requests", "4",
            "--repeats", "2", "--warmup", "1", "--reruns", "0",
            "--slo-ttft-ms", "60000", "--slo-tpot-ms", "10000", "--out", str(out),
            "--log-dir", str(tmp_path / "logs"), "--results-dir", str(results),
            "--", "--enforce-eager"]
    # files, not pipes: nobody reads a pipe while this waits
    with (tmp_path / "tune.out").open("wb") as so, (tmp_path / "tune.err").open("wb") as se:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=so, stderr=se, start_new_session=True,
                                env=early.environ())
    deadline = time.monotonic() + 1500
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, "launcher tune ran past 1500 s"
            early.pause(1.0)
    except BaseException:
        proc.send_signal(signal.SIGTERM)  # tune stops the engine it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    return Tuned(proc.returncode, (tmp_path / "tune.out").read_text(errors="replace"),
                 (tmp_path / "tune.err").read_text(errors="replace"), out, results)


# begun in the background at collection (the test runs after the pure ones)
early.register(__file__, "tune_run", begin_tune, lambda _: None, holds=False)


@pytest.fixture
def tune_run(tmp_path_factory: pytest.TempPathFactory) -> Tuned:
    result: Tuned = early.take(__file__, "tune_run", tmp_path_factory)
    return result


@pytest.mark.stack
def test_tune_measures_rounds_with_intervals_meets_an_slo_and_writes_a_servable_plan(
    tune_run: Tuned,
) -> None:
    """The whole `launcher tune` on vLLM CPU: the two CPU candidates, two measured rounds each
    after a warm-up, judged against a TTFT/TPOT SLO the tiny model meets. --reruns 0: the two
    are equally fast at a 64-token prompt, so whether their intervals overlap (and a re-run
    doubles the starts, about 50 s each on two cores) is up to the machine; the re-run itself
    is test_tune_rerun.py's, on cue. Every candidate gets `-- --enforce-eager` (flags after --
    go to every candidate): without it each start traces the model with torch.compile again
    (vLLM 0.32's CPU engine fails to load its own AOT cache), 25 to 50 s more each."""
    res, out, results = tune_run, tune_run.out, tune_run.results
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    tuned = data["tuned"]
    assert tuned["objective"] == "slo"
    assert tuned["slo"] == {"ttft_ms": 60000, "tpot_ms": 10000}
    assert tuned["interval"] == "95% Student t over rounds"
    by_name = {r["candidate"]: r for r in tuned["results"]}
    assert set(by_name) == {"default", "small-prefill-chunks"}
    for r in by_name.values():
        assert r["ok"]
        assert r["meets_slo"] is True
        assert r["rounds"] == 2 == len(r["scores"])
        assert r["slo_total"] == 4 * r["rounds"]
        assert r["slo_met"] == r["slo_total"]
        assert r["low"] <= r["score"] <= r["high"]
        assert all(s > 0 for s in r["scores"])
    best = max(tuned["results"], key=lambda r: r["score"])
    assert tuned["winner"] == best["candidate"]
    # every round is a loadgen JSON kept in --results-dir, named after its start
    rounds = sorted(p.name for p in results.glob("*.json"))
    assert rounds == sorted(f"{name}-start1-round{k}.json" for name in by_name for k in (1, 2))
    assert data["engine"] == "cpu"
    assert data["mode"] == "single"
    # the winner's own flags, then the flags given to every candidate
    if best["candidate"] == "small-prefill-chunks":
        assert data["vllm_extra_args"] == ["--max-num-batched-tokens", "256", "--enforce-eager"]
    else:
        assert data["vllm_extra_args"] == ["--enforce-eager"]
    table = res.stdout
    assert "launcher tune: measured through the proxy — objective slo" in table
    assert "TTFT ≤ 60000 ms and TPOT ≤ 10000 ms" in table
    assert re.search(r"yes (\d+)/\1", table)  # every request within the SLO
    assert "95% CI" in table
    # The written plan is what `launcher serve --plan` takes.
    dry = subprocess.run(
        [sys.executable, "-m", "launcher", "serve", "--plan", str(out), "--dry-run",
         "--port", str(free_port())], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "vllm serve" in dry.stdout


def test_the_plan_tune_writes_renders_the_command_plan_prints_for_the_same_options() -> None:
    # tune plans and renders each candidate once (pinned to this process's CPUs) and writes
    # that command: the one `launcher plan --json` prints for the same options and port
    import contextlib
    import io
    import os

    from launcher.cli.cmd_tune import candidate_request, tuned_plan_json
    from launcher.cli.main import build_parser, main
    from launcher.pipeline.run import plan_and_render

    tiny = str(REPO / "tests" / "fixtures" / "models" / "llama-3.2-3b")
    cpu_only = str(REPO / "tests" / "fixtures" / "golden" / "cpu-only.toposerve.json")
    args = build_parser().parse_args(["tune", "--model", tiny, "--topology", cpu_only])
    request = candidate_request(args, parse_candidate("tp=2"), ())  # two CPU workers
    planned = plan_and_render(request.plan, os.environ)
    tuned = tuned_plan_json(planned)
    policy = request.plan.policy
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--json", "--model", tiny, "--topology", cpu_only, "--tp", "2",
                     "--workload", policy.workload, "--concurrency", str(policy.concurrency),
                     "--port", str(planned.port)]) == 0
    printed = json.loads(out.getvalue())
    assert tuned["engines"] == printed["engines"]
    assert tuned["argv"] == printed["argv"]
