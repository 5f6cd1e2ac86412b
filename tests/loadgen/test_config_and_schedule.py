"""Argument validation, arrival schedules, plan labels, comparisons: pure parts."""

from __future__ import annotations

import itertools
import statistics

import pytest

from loadgen.config import Config, parse_label, parse_sweep, validate
from loadgen.errors import BadArgument
from loadgen.outputs.compare import comparison, ratio
from loadgen.schedule import arrival_offsets
from loadgen.target import plan_label


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"prompt": 0}, "--prompt must be at least 1"),
        ({"gen": 0}, "--gen must be at least 1"),
        ({"concurrency": 0}, "--concurrency must be at least 1"),
        ({"rate": -1.0}, "--rate must be a finite number above 0"),
        ({"arrivals": "burst"}, "--arrivals must be one of"),
        ({"shared_prefix": 512}, "--shared-prefix 512 must be below --prompt 512"),
        ({"sweep": (1, 2), "rate": 3.0}, "cannot be combined with --rate"),
        ({"plot_path": "x.png"}, "--plot draws a sweep"),
        ({"url": "127.0.0.1:8000"}, "--url must start with http"),
        ({"labels": (("model", "x"),)}, "--label model=..."),
        ({"labels": (("9x", "y"),)}, "--label 9x=..."),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(changes: dict[str, object], message: str) -> None:
    with pytest.raises(BadArgument, match=message.replace("+", r"\+")):
        validate(Config(**changes))  # type: ignore[arg-type]


def test_label_and_sweep_parsing() -> None:
    assert parse_label("gpu=h100=sxm") == ("gpu", "h100=sxm")
    assert parse_sweep("1,2, 4,") == (1, 2, 4)
    for bad in ("nolabel", "=x"):
        with pytest.raises(BadArgument):
            parse_label(bad)
    with pytest.raises(BadArgument):
        parse_sweep("1,two")


def test_default_requests_scale_with_concurrency() -> None:
    assert Config().requests_for(1) == 8
    assert Config().requests_for(64) == 256
    assert Config(requests=3).requests_for(64) == 3
    assert Config(duration=5.0).requests_for(4) is None


def test_constant_arrivals_are_evenly_spaced() -> None:
    assert list(arrival_offsets(4.0, "constant", 0, count=4)) == [0.0, 0.25, 0.5, 0.75]


def test_poisson_arrivals_have_the_asked_mean_rate_and_are_seeded() -> None:
    offsets = list(arrival_offsets(50.0, "poisson", 1, count=5000))
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert statistics.mean(gaps) == pytest.approx(1 / 50.0, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / 50.0, rel=0.1)  # exponential: sd = mean
    assert offsets[:10] == list(arrival_offsets(50.0, "poisson", 1, count=10))


def test_duration_bounds_the_schedule() -> None:
    assert max(arrival_offsets(10.0, "constant", 0, duration=1.0)) < 1.0


METRICS = """# HELP toposerve_plan_info The plan in force
# TYPE toposerve_plan_info gauge
toposerve_plan_info{dp="1",engine="vllm",gpus="0,1",mode="tp",model="m",pp="1",tp="2",\
transport="nvlink"} 1.0
# TYPE toposerve_requests_in_flight gauge
toposerve_requests_in_flight{model="m",route="/v1/completions"} 0.0
"""


@pytest.mark.parametrize(
    ("text", "label"),
    [
        (METRICS, "mode=tp,tp=2,pp=1,dp=1,transport=nvlink,engine=vllm"),
        ("# TYPE x gauge\nx 1\n", "unknown"),
        ('toposerve_plan_info{mode="",tp="",pp="",dp=""} 1\n', "unknown"),
        (None, "unknown"),
        ("this is { not prometheus", "unknown"),
    ],
)
def test_plan_label_reads_toposerve_plan_info(text: str | None, label: str) -> None:
    assert plan_label(text) == label


def _run(conc: int, ttft: float, out: float) -> dict[str, object]:
    return {
        "config": {"concurrency": conc},
        "summary": {"ttft_s": {"p50": ttft}, "output_tok_s": out, "requests_ok": 3},
    }


def test_comparison_gives_b_over_a_per_common_level() -> None:
    a = {"runs": [_run(1, 0.1, 100.0), _run(2, 0.2, 150.0)]}
    b = _run(2, 0.1, 300.0)
    rows = {(c, label): r for c, label, _, _, r, _ in comparison(a, b)}
    assert rows[(2, "TTFT p50 s")] == pytest.approx(0.5)
    assert rows[(2, "output tok/s")] == pytest.approx(2.0)
    assert (1, "TTFT p50 s") not in rows
    assert ratio(0.0, 1.0) is None
