"""SLOs and goodput: which requests meet TTFT/TPOT objectives, and the highest load that does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadgen.slo import Slo, best_level, judge, met
from loadgen.timing import RequestResult
from tests.loadgen.conftest import run_cli


def _r(
    ttft: float | None, e2e: float, completion: int = 11, error: str | None = None
) -> RequestResult:
    return RequestResult(0, 10, completion, ttft, e2e, None, None, (), None, error)


def test_a_request_meets_the_slo_only_within_both_objectives() -> None:
    slo = Slo(ttft_s=0.2, tpot_s=0.01)
    assert met(_r(0.2, 0.3), slo)  # TPOT (0.3 - 0.2) / 10 = 10 ms: at the limit
    assert not met(_r(0.21, 0.3), slo)
    assert not met(_r(0.1, 0.3), slo)  # TPOT 20 ms
    assert not met(_r(0.1, 0.15, error="HTTP 500: x"), slo)
    assert not met(_r(None, 0.15), slo)
    assert met(_r(0.5, 0.6), Slo(ttft_s=None, tpot_s=0.01))  # only TPOT judged
    assert met(_r(0.1, 0.1, completion=1), slo)  # one token: no TPOT to judge


def test_goodput_counts_only_what_met_the_slo() -> None:
    results = [_r(0.1, 0.2), _r(0.1, 0.2), _r(0.5, 0.6), _r(0.1, 0.2, error="boom")]
    s = judge(results, Slo(ttft_s=0.2, tpot_s=None, share=0.5), duration_s=2.0)
    assert (s.met, s.total, s.share) == (2, 4, 0.5)
    assert s.meets  # 50 % asked
    assert s.goodput_req_s == pytest.approx(1.0)
    assert s.goodput_tok_s == pytest.approx(11.0)
    assert not judge(results, Slo(0.2, None, share=0.9), 2.0).meets


def test_the_highest_level_that_meets_the_slo_is_named_even_if_a_lower_one_missed() -> None:
    slo = Slo(0.2, None, share=0.9)
    good = judge([_r(0.1, 0.2)] * 10, slo, 1.0)
    bad = judge([_r(0.3, 0.4)] * 10, slo, 1.0)
    assert best_level([(1, good), (2, bad), (4, good), (8, bad)]) == 4
    assert best_level([(1, bad), (2, bad)]) is None
    assert best_level([]) is None


def test_a_sweep_writes_each_level_slo_and_the_best_level(sim_url: str, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    result = run_cli(
        "--url", sim_url, "--prompt", "64", "--gen", "8", "--sweep", "1,2", "--requests", "4",
        "--slo-ttft-ms", "500", "--slo-tpot-ms", "100", "--json", str(out), "--no-progress",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    for run in data["runs"]:
        slo = run["summary"]["slo"]
        assert (slo["met"], slo["total"], slo["meets"]) == (4, 4, True)
        assert slo["goodput_tok_s"] == pytest.approx(run["summary"]["output_tok_s"])
        assert all(r["slo_met"] for r in run["requests"])
    assert data["slo_best"]["concurrency"] == 2
    assert "highest load meeting the SLO: concurrency 2" in result.stdout


def test_an_slo_no_request_can_meet_is_reported_as_missed(sim_url: str, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    # the simulated engine's first token comes after 80 ms
    result = run_cli(
        "--url", sim_url, "--prompt", "64", "--gen", "8", "--sweep", "1,2", "--requests", "4",
        "--slo-ttft-ms", "20", "--json", str(out), "--no-progress",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert [r["summary"]["slo"]["share"] for r in data["runs"]] == [0.0, 0.0]
    assert data["slo_best"]["concurrency"] is None
    assert "SLO TTFT <= 20 ms: 0 of 4 requests (0%; misses the 90% asked)" in result.stdout


def test_a_single_run_reports_its_slo_share_and_goodput(sim_url: str, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    result = run_cli(
        "--url", sim_url, "--prompt", "64", "--gen", "8", "--requests", "4",
        "--slo-ttft-ms", "500", "--json", str(out), "--no-progress",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    slo = json.loads(out.read_text())["summary"]["slo"]
    assert (slo["ttft_ms"], slo["tpot_ms"], slo["share"]) == (500, None, 1.0)
    assert "goodput" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--slo-ttft-ms", "0"), "--slo-ttft-ms must be a finite number above 0"),
        (("--slo-tpot-ms", "-1"), "--slo-tpot-ms must be a finite number above 0"),
        (("--slo-share", "1.5"), "--slo-share must be above 0 and at most 1"),
    ],
)
def test_impossible_slos_are_refused(args: tuple[str, ...], message: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr
