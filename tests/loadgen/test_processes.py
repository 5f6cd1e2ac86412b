"""--processes N: the split is pure and exact; merged runs measure like one loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadgen.procs import merge, split, split_shape
from loadgen.runner import Driven, Shape
from loadgen.stats import LoopHealth, dist
from loadgen.timing import RawRequest
from tests.loadgen.conftest import ITL, TTFT, run_cli


@pytest.mark.parametrize(
    ("total", "parts", "shares"), [(8, 2, [4, 4]), (7, 3, [3, 2, 2]), (2, 2, [1, 1])]
)
def test_split_adds_up(total: int, parts: int, shares: list[int]) -> None:
    assert split(total, parts) == shares


def test_split_shape_divides_streams_rate_and_requests_and_varies_the_seed() -> None:
    shapes = split_shape(Shape(concurrency=5, rate=10.0, requests=9, duration=None, seed=3), 2)
    assert [s.concurrency for s in shapes] == [3, 2]
    assert [s.requests for s in shapes] == [5, 4]
    assert [s.rate for s in shapes] == [5.0, 5.0]
    assert shapes[0].seed != shapes[1].seed


def test_merge_orders_requests_and_keeps_the_busiest_loop() -> None:
    def part(indices: list[int], cpu: float, lags: tuple[float, ...]) -> Driven:
        raws = tuple(RawRequest(i, float(i), float(i) + 1) for i in indices)
        return Driven(raws, LoopHealth(dist(lags), cpu), lags)

    merged = merge([part([1, 3], 0.2, (0.001,)), part([0, 2], 0.5, (0.002, 0.003))])
    assert [r.index for r in merged.raws] == [0, 1, 2, 3]
    assert merged.loop.cpu_fraction == 0.5
    assert merged.loop.lag_s.n == 3


@pytest.mark.parametrize(
    "shape",
    [
        ["--concurrency", "8", "--requests", "24", "--warmup", "2"],
        ["--rate", "30", "--arrivals", "constant", "--requests", "12"],
    ],
    ids=["closed", "open"],
)
def test_two_processes_give_exact_counts_and_accurate_timings(
    sim_url: str, tmp_path: Path, shape: list[str]
) -> None:
    out = tmp_path / "r.json"
    result = run_cli(
        "--url",
        sim_url,
        "--prompt",
        "128",
        "--gen",
        "32",
        "--processes",
        "2",
        *shape,
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    n = int(shape[shape.index("--requests") + 1])
    indices = [r["index"] for r in data["requests"]]
    assert len(set(indices)) == n  # every request its own prompt, none lost or doubled
    assert {(r["prompt_tokens"], r["completion_tokens"], r["error"]) for r in data["requests"]} == {
        (128, 32, None)
    }
    s = data["summary"]
    assert s["ttft_s"]["min"] >= TTFT  # both loops' clocks are the one monotonic clock
    after_headers = sorted(r["ttft_s"] - r["headers_s"] for r in data["requests"])
    assert after_headers[len(after_headers) // 2] == pytest.approx(TTFT, abs=0.01)
    assert s["decode_tok_s"]["p50"] == pytest.approx(1 / ITL, rel=0.02)


def test_more_processes_than_streams_is_refused(sim_url: str) -> None:
    result = run_cli("--url", sim_url, "--concurrency", "2", "--processes", "4")
    assert result.returncode == 2
    assert "--processes 4 needs at least that many concurrent streams" in result.stderr
