"""The API server's way in as the load simulation models it (schedsim._FrontEnd), checked on
generated sends: its loop shares a request's fixed work among the requests on it, so no request
is through faster than alone, the loop never does more than one second of work a second, it
idles only when nobody is on it, and requests that never overlap never wait for each other."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.planner.schedsim import Workload, simulate
from tests.launcher.instant_steps import LIM, STEP_S, Instant


def first_tokens(sends: list[float], shared_s: float) -> list[tuple[float, float]]:
    res = simulate(LIM, Instant(), Workload(16, 1, arrivals=tuple(sends)),
                   request_overhead_s=shared_s, request_shared_s=shared_s)
    return sorted((r.sent_s, r.first_token_s) for r in res.requests)


sends_st = st.lists(st.floats(min_value=0.0, max_value=0.05, allow_nan=False), min_size=1,
                    max_size=12)
work_st = st.floats(min_value=1e-4, max_value=0.01, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(sends=sends_st, work=work_st)
def test_no_request_is_through_the_loop_faster_than_alone(sends: list[float], work: float) -> None:
    for sent, first in first_tokens(sends, work):
        assert first - sent >= work - 1e-9


@settings(max_examples=200, deadline=None)
@given(sends=sends_st, work=work_st)
def test_the_loop_does_at_most_one_second_of_work_a_second_and_idles_only_when_empty(
        sends: list[float], work: float) -> None:
    got = first_tokens(sends, work)
    firsts = sorted(f for _, f in got)
    # by each hand-over the loop has done the work of every request handed over so far, and
    # no more than the time since the first send allows
    for k, f in enumerate(firsts, start=1):
        assert f >= min(sends) + k * work - 1e-9
    # work-conserving: the last is through when the loop has done all the work, counted from
    # the moments it had any (busy periods), plus the steps' own time
    busy_end = -1.0
    for s in sorted(sends):
        busy_end = max(busy_end, s) + work
    assert firsts[-1] == pytest.approx(busy_end, abs=len(sends) * 2 * STEP_S + 1e-9)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(min_value=1, max_value=12), work=work_st)
def test_requests_sent_at_one_moment_are_all_through_when_all_the_work_is_done(
        n: int, work: float) -> None:
    for _, first in first_tokens([0.0] * n, work):
        assert first == pytest.approx(n * work, abs=2 * STEP_S + 1e-9)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(min_value=1, max_value=12), work=work_st)
def test_requests_that_never_overlap_on_the_loop_never_wait(n: int, work: float) -> None:
    sends = [k * 1.5 * work for k in range(n)]
    for sent, first in first_tokens(sends, work):
        assert first - sent == pytest.approx(work, abs=2 * STEP_S + 1e-9)
