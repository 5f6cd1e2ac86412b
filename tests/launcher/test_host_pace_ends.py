"""The paces a plan's host-pace range spans (HostTiming.pace_ends): the fastest the host was
seen at before the run (the least of the sampled fastest tenth, the rounds and the planned
pace) and the slowest (the greater of the rounds and the planned), so that the planned pace lies
between them whichever way the rounds ran. Issue 22's fifteenth table timed its rounds in a slow
spell (R 0.974 ms) over a sampled pace S 0.7065 ms, its fastest tenth F 0.495 ms, and its
Qwen2.5-1.5B engine ran at the fast level (benchmarks/gpu/host-pace-t15.md): a range from the
rounds to the planned pace had no end below the planned one."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.pipeline import hostcosts
from launcher.probe.hostcost import MAX_PACE, HostKey, HostTiming, Steadiness

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "gpu" / "results"


def timing(rounds_s: float, sampled_s: float, over_tenth: float) -> HostTiming:
    """A record whose rounds' reference took ``rounds_s``, its samples' harmonic mean
    ``sampled_s``, that ``over_tenth`` x their fastest tenth's."""
    st_ = Steadiness(rounds=5, dropped=0, spread=(("step_s", 1.02),), speed_spread=1.02,
                     host_slowed=1.02, others_busy=0.0, reference_s=rounds_s,
                     sustained=over_tenth, sustained_s=sampled_s)
    return HostTiming(HostKey("cpu", 16, "0.0"), 1e-6, 1e-3, 1e-3, 1e-4, "2026-12-05T00:00:00",
                      st_)


def test_rounds_in_a_slow_spell_give_a_fast_end_below_the_planned_pace_and_a_slow_end_above(
        ) -> None:
    t = timing(0.974e-3, 0.7065e-3, 1.428)  # table 15's qwen15 record
    fast, slow = t.pace_ends()
    assert fast < t.pace() < slow
    assert fast == pytest.approx(0.7065 / 1.428 / 0.974)  # F over R
    assert slow == 1.0  # the rounds'


def test_rounds_faster_than_the_samples_keep_the_range_from_the_rounds_to_the_planned_pace(
        ) -> None:
    # the fastest tenth no faster than the rounds: the range as before, [R, S]
    t = timing(0.5e-3, 0.75e-3, 1.4)  # F 0.536 ms
    assert t.pace_ends() == (1.0, t.pace())
    # a fastest tenth below the rounds is the fast end
    t = timing(0.568e-3, 0.858e-3, 1.549)  # table 14's qwen15 record: F 0.554 ms
    fast, slow = t.pace_ends()
    assert fast == pytest.approx(0.858 / 1.549 / 0.568)
    assert fast < 1.0
    assert slow == t.pace() == pytest.approx(0.858 / 0.568)


def test_a_record_without_the_samples_gives_its_pace_at_both_ends() -> None:
    assert timing(0.5e-3, 0.0, 0.0).pace_ends() == (1.0, 1.0)
    # samples, but no fastest tenth recorded: from the rounds to the planned pace
    t = timing(0.974e-3, 0.7065e-3, 0.0)
    assert t.pace_ends() == (t.pace(), 1.0)
    # a fastest tenth past MAX_PACE of the rounds is no host's: left out
    t = timing(1e-3, 0.7e-3, 0.7 * MAX_PACE * 1.01)
    assert t.pace_ends() == (t.pace(), 1.0)


@settings(max_examples=300, deadline=None)
@given(st.floats(1e-5, 1e-2), st.floats(1e-5, 1e-2), st.floats(0.0, 50.0))
def test_the_planned_pace_lies_between_the_ends(rounds_s: float, sampled_s: float,
                                                over_tenth: float) -> None:
    t = timing(rounds_s, sampled_s, over_tenth)
    fast, slow = t.pace_ends()
    assert 1 / MAX_PACE <= fast <= t.pace() <= slow <= MAX_PACE
    assert fast <= 1.0 <= slow or t.pace() == 1.0


@pytest.mark.parametrize("table", ["2026-12-04-h200-table12", "2026-12-04-h200-table13",
                                   "2026-12-05-h200-table14", "2026-12-05-h100-table15"])
def test_each_saved_host_record_spans_its_fastest_tenth_rounds_and_sampled_pace(
        table: str) -> None:
    for path in sorted((RESULTS / table).glob("host-cost-*.json")):
        t = hostcosts.read(str(path))
        st_ = t.steadiness
        assert st_ is not None
        fast, slow = t.pace_ends()
        tenth = st_.sustained_s / st_.sustained / st_.reference_s
        assert fast == pytest.approx(min(tenth, 1.0, t.pace())), path.name
        assert slow == pytest.approx(max(1.0, t.pace())), path.name
