"""`launcher tune`: candidate specs, scoring, and a real A/B of two CPU engine settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.errors import LauncherError
from launcher.tune import CandidateSpec, Measured, parse_candidate, score, winner
from tests.conftest import REPO, free_port


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


def summary(ttft: float, decode: float, output: float, failed: int = 0) -> dict[str, Any]:
    return {"requests_ok": 3, "requests_failed": failed, "ttft_s": {"p50": ttft},
            "decode_tok_s": {"p50": decode}, "output_tok_s": output}


def test_interactive_prefers_the_faster_whole_answer_not_the_faster_first_token() -> None:
    # A: fast first token, slow decode; B: slower first token, much faster decode.
    a = Measured(CandidateSpec("a"), True, summary(0.05, 20.0, 100))
    b = Measured(CandidateSpec("b"), True, summary(0.30, 40.0, 90))
    assert winner([a, b], "interactive", 256) is b
    assert score(a.summary, "interactive", 256) == pytest.approx(1 / (0.05 + 255 / 20.0))


def test_throughput_prefers_aggregate_output_tokens() -> None:
    a = Measured(CandidateSpec("a"), True, summary(0.05, 20.0, 900))
    b = Measured(CandidateSpec("b"), True, summary(0.30, 40.0, 600))
    assert winner([a, b], "throughput", 256) is a


def test_a_candidate_with_failed_requests_cannot_win() -> None:
    a = Measured(CandidateSpec("a"), True, summary(0.01, 99.0, 9999, failed=1))
    b = Measured(CandidateSpec("b"), True, summary(0.30, 40.0, 600))
    assert winner([a, b], "throughput", 256) is b


def test_no_measurable_candidate_is_an_error_naming_each() -> None:
    with pytest.raises(LauncherError, match="a: engine broke; b: no valid"):
        winner([Measured(CandidateSpec("a"), False, error="engine broke"),
                Measured(CandidateSpec("b"), True, {})], "interactive", 8)


@pytest.mark.stack
def test_tune_ab_tests_two_cpu_engine_settings_and_writes_a_servable_plan(
    tmp_path: Path, tiny_model_path: str
) -> None:
    out = tmp_path / "plan.json"
    res = subprocess.run(
        [sys.executable, "-m", "launcher", "tune", "--port", str(free_port()),
         "--prompt", "64", "--gen", "16", "--requests", "2", "--out", str(out),
         "--log-dir", str(tmp_path / "logs"), "--results-dir", str(tmp_path / "results")],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    tuned = data["tuned"]
    assert {r["candidate"] for r in tuned["results"]} == {"default", "small-prefill-chunks"}
    assert all(r["ok"] and r["score"] > 0 for r in tuned["results"])
    best = max(tuned["results"], key=lambda r: r["score"])
    assert tuned["winner"] == best["candidate"]
    assert data["engine"] == "cpu"
    assert data["mode"] == "single"
    if best["candidate"] == "small-prefill-chunks":
        assert data["vllm_extra_args"] == ["--max-num-batched-tokens", "256"]
    assert "launcher tune: measured through the proxy" in res.stdout
    # The written plan is what `launcher serve --plan` takes.
    dry = subprocess.run(
        [sys.executable, "-m", "launcher", "serve", "--plan", str(out), "--dry-run",
         "--port", str(free_port())], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "vllm serve" in dry.stdout
