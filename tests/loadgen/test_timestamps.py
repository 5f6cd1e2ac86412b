"""Per-request send, first-token and end times in the JSON: requests in flight over time."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from loadgen.stats import max_in_flight
from loadgen.timing import RequestResult
from tests.loadgen.conftest import TTFT, run_cli


def _at(sent: float, done: float) -> RequestResult:
    return RequestResult(0, 1, 1, None, done - sent, None, None, (), None, None,
                         sent_at=sent, done_at=done)  # fmt: skip


def test_max_in_flight_counts_overlaps_and_not_back_to_back_requests() -> None:
    assert max_in_flight([]) == 0
    assert max_in_flight([_at(0, 1), _at(1, 2), _at(2, 3)]) == 1  # one ends as the next starts
    assert max_in_flight([_at(0, 3), _at(1, 2), _at(1.5, 4)]) == 3
    assert max_in_flight([_at(0, 1), _at(0.5, 2), _at(3, 4)]) == 2


def _requests(path: Path) -> list[dict[str, Any]]:
    data: dict[str, Any] = json.loads(path.read_text())
    return list(data["requests"])


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_burst_shows_as_one_in_the_request_timestamps(
    sim_url: str, tmp_path: Path, processes: str
) -> None:
    out = tmp_path / "r.json"
    result = run_cli(
        "--url", sim_url, "--prompt", "32", "--gen", "8", "--concurrency", "8", "--requests",
        "8", "--processes", processes, "--json", str(out), "--no-progress",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = _requests(out)
    assert min(r["t_sent_s"] for r in rows) == 0.0  # relative to the level's first send
    for r in rows:
        assert 0 <= r["t_sent_s"] < r["t_first_token_s"] < r["t_end_s"]
        assert r["t_first_token_s"] - r["t_sent_s"] == pytest.approx(r["ttft_s"])
        assert r["t_end_s"] - r["t_sent_s"] == pytest.approx(r["e2e_s"])
    # all 8 left before the first answer's first token could come back (80 ms): one burst,
    # from one process or from two on the same clock
    assert max(r["t_sent_s"] for r in rows) < min(r["t_first_token_s"] for r in rows)
    assert min(r["t_first_token_s"] for r in rows) >= TTFT
    assert json.loads(out.read_text())["summary"]["max_in_flight"] == 8


def test_a_closed_loop_of_one_never_has_two_in_flight(sim_url: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = run_cli(
        "--url", sim_url, "--prompt", "32", "--gen", "4", "--requests", "3", "--json", str(out)
    )
    assert result.returncode == 0, result.stderr
    rows = sorted(_requests(out), key=lambda r: r["t_sent_s"])
    for before, after in itertools.pairwise(rows):
        assert after["t_sent_s"] >= before["t_end_s"]
    assert json.loads(out.read_text())["summary"]["max_in_flight"] == 1
