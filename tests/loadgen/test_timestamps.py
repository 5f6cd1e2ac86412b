"""Per-request send, first-token and end times in the JSON: requests in flight over time."""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
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


def _sim(url: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        answer: dict[str, Any] = json.load(resp)
    return answer


@contextlib.contextmanager
def answered_in_groups(url: str, groups: tuple[int, ...], at_most_s: float = 60.0
                       ) -> Iterator[None]:
    """The simulator holds every generation before its first token until the next group's
    count of them is in it, then lets that group go and holds the next (or once ``at_most_s``
    passed: a loadgen that does not send a group together fails the test instead of hanging
    it)."""
    _sim(url, "/sim/control", {"hold": True})
    done = threading.Event()

    def release() -> None:
        for n in groups:
            deadline = time.monotonic() + at_most_s
            while (not done.is_set() and time.monotonic() < deadline
                   and _sim(url, "/sim/stats")["running"] < n):
                time.sleep(0.01)
            _sim(url, "/sim/control", {"let_go": True})

    releaser = threading.Thread(target=release, daemon=True)
    releaser.start()
    try:
        yield
    finally:
        done.set()
        releaser.join()
        _sim(url, "/sim/control", {"hold": False})


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_burst_shows_as_one_in_the_request_timestamps(
    sim_url: str, tmp_path: Path, processes: str
) -> None:
    """Eight streams sent at once are in flight together in the timestamps, from one process or
    from two on the same clock. The simulator answers none of them until all eight have reached
    it (loadgen's one-token check of the exact-length fields, alone, is answered first): with
    the 80 ms first token as the bound, loadgen held up in the middle of its burst (h125's stall
    injector) stamped its last send 0.275 s after the first, after a first token at 0.081 s."""
    out = tmp_path / "r.json"
    with answered_in_groups(sim_url, (1, 8)):
        result = run_cli(
            "--url", sim_url, "--prompt", "32", "--gen", "8", "--concurrency", "8", "--requests",
            "8", "--processes", processes, "--json", str(out), "--no-progress", "--no-warmup",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = _requests(out)
    assert min(r["t_sent_s"] for r in rows) == 0.0  # relative to the level's first send
    for r in rows:
        # a stream loadgen read in one piece after being held up has its first token and its
        # end in the same read
        assert 0 <= r["t_sent_s"] < r["t_first_token_s"] <= r["t_end_s"]
        assert r["t_first_token_s"] - r["t_sent_s"] == pytest.approx(r["ttft_s"])
        assert r["t_end_s"] - r["t_sent_s"] == pytest.approx(r["e2e_s"])
    # all 8 left before the first answer's first token came back: one burst
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
