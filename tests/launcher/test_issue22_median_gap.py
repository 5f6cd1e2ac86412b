"""benchmarks/gpu/issue22_median_gap.py: whether a 32-stream TTFT p50 sits on the edge of a gap
between the burst's groups of first tokens, and issue22_simwaves.py's replanned runs at the
utilisation the table was served at. Issue 22, table 15 (H100): Gemma-3-12B's p50 planned 0.411 s
against 0.506 measured, where the plan's simulated run had exactly 64 of its 128 TTFTs below a
0.19 s gap (0.316..0.507), so its p50 fell halfway across it, and the record had 63."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "benchmarks" / "gpu"
H200 = GPU / "results" / "2026-12-01-h200-lead" / "h200-probe.json"
H100_T15 = GPU / "h100-table15-nvml.json"

GAP = load_script("benchmarks/gpu/issue22_median_gap.py", "issue22_median_gap_benchmark")


def burst(below: int, low: float = 0.3, high: float = 0.5, n: int = 128) -> list[float]:
    """``n`` TTFTs in two tight groups: ``below`` of them at ``low`` (+ a little each), the rest
    at ``high``."""
    return [low + i * 1e-4 for i in range(below)] + [high + i * 1e-4 for i in range(n - below)]


def test_a_p50_with_exactly_half_below_a_gap_lies_halfway_across_it() -> None:
    g = GAP.median_gap(burst(64))
    assert g.below == 64
    assert g.low < g.p50 < g.high  # a time no request had
    assert g.p50 == pytest.approx((g.low + g.high) / 2)
    assert "in the gap" in g.line()


def test_one_request_across_the_gap_moves_the_p50_to_a_group() -> None:
    above, below = GAP.median_gap(burst(63)), GAP.median_gap(burst(65))
    assert above.p50 >= 0.5
    assert below.p50 <= 0.31
    assert "on a group" in above.line()
    assert "on a group" in below.line()


def test_the_p50_span_reaches_across_the_gap_only_near_the_edge() -> None:
    near = GAP.p50_span(burst(63), 2)
    # two requests moved put it on either side
    assert near[0] < 0.31
    assert near[1] >= 0.5
    far = GAP.p50_span(burst(72), 2)
    assert far[1] < 0.31  # eight requests from the edge: the figure stays in its group


def test_the_widest_gap_is_looked_for_in_the_middle_half_only() -> None:
    # a wider gap among the first quarter (a burst's lone first prompts) is not the median's
    values = [0.05] * 4 + [0.9 + i * 1e-3 for i in range(60)] + [1.0 + i * 1e-3 for i in range(64)]
    g = GAP.median_gap(values)
    assert (g.below, round(g.low, 3), round(g.high, 3)) == (64, 0.959, 1.0)


def test_fewer_than_two_values_have_no_gap() -> None:
    with pytest.raises(ValueError, match="two values"):
        GAP.median_gap([0.3])


def test_simulated_runs_of_an_h100_table_are_planned_at_the_served_utilisation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue22-table.sh scaled gemma12d's 0.4 of an H200 to 0.71 of the H100 it ran on; the
    # replanned runs read the replay's topology.json and must plan the same fraction
    monkeypatch.syspath_prepend(str(GPU))
    for name in ("issue22_now", "issue22_table", "issue22_simwaves"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import issue22_now
    import issue22_simwaves

    def util(reading: Path, out: Path) -> str:
        out.mkdir()
        issue22_now.machine_topology(reading, out)
        args = issue22_simwaves.plan_args("gemma12d", "c32", out, None)
        return str(args[args.index("--gpu-memory-utilization") + 1])

    assert util(H100_T15, tmp_path / "h100") == "0.71"
    assert util(H200, tmp_path / "h200") == "0.4"
