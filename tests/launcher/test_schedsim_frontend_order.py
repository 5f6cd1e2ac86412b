"""The order in which vLLM's API server loop takes a burst in and lets its first tokens out, as
the load simulation models it (schedsim._FrontEnd, measured with
benchmarks/vllm_frontend_order/): the shared stages of every request first, then the hand-overs
one after another, and an engine output that reaches the loop while it is taking requests in
goes out only once the loop is through the way in queued before it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.planner.schedsim import (
    StepBatch,
    Turn,
    Workload,
    simulate,
    simulate_sessions,
)
from tests.launcher.instant_steps import LIM, STEP_S, Instant


def firsts(sends: tuple[float, ...], shared_s: float, serial_s: float) -> list[tuple[float, float]]:
    res = simulate(LIM, Instant(), Workload(16, 1, arrivals=sends),
                   request_overhead_s=shared_s + serial_s, request_shared_s=shared_s,
                   request_serial_s=serial_s)
    return sorted((r.sent_s, r.first_token_s) for r in res.requests)


work_st = st.floats(min_value=1e-4, max_value=0.01, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(min_value=2, max_value=16), shared=work_st, serial=work_st)
def test_a_bursts_first_tokens_wait_until_the_loop_has_taken_the_whole_burst_in(
        n: int, shared: float, serial: float) -> None:
    # the first request is handed over after every request's shared work and its own serial
    # work, the others one serial apart; the engine answers at once, but the outputs wait on
    # the loop behind the hand-overs queued before them: all go out with the last hand-over
    for _, first in firsts((0.0,) * n, shared, serial):
        assert first == pytest.approx(n * (shared + serial), abs=n * 2 * STEP_S + 1e-9)


@settings(max_examples=100, deadline=None)
@given(shared=work_st, serial=work_st)
def test_a_lone_requests_first_token_is_not_held(shared: float, serial: float) -> None:
    [(sent, first)] = firsts((0.0,), shared, serial)
    assert first - sent == pytest.approx(shared + serial, abs=2 * STEP_S + 1e-9)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(min_value=1, max_value=12), shared=work_st, serial=work_st)
def test_requests_that_never_overlap_on_the_loop_are_never_held(
        n: int, shared: float, serial: float) -> None:
    gap = 1.5 * (shared + serial)
    for sent, first in firsts(tuple(k * gap for k in range(n)), shared, serial):
        assert first - sent == pytest.approx(shared + serial, abs=2 * STEP_S + 1e-9)


def test_an_output_that_reaches_the_loop_after_the_burst_is_not_held() -> None:
    # steps far longer than the burst's intake: the first tokens come when the steps end
    @dataclass(frozen=True)
    class Slow:
        def step_s(self, batch: StepBatch) -> float:
            return 1.0

    res = simulate(LIM, Slow(), Workload(16, 1, arrivals=(0.0, 0.0)), request_overhead_s=0.002,
                   request_shared_s=0.001, request_serial_s=0.001)
    # the first request alone in the first step (handed over at 2 + 1 ms), the second in the next
    assert sorted(r.first_token_s for r in res.requests) == pytest.approx([1.003, 2.003])


def test_sessions_share_the_loops_work_on_their_prompts() -> None:
    # two sessions send a turn of 1,000 tokens at once; the loop's 1 us a token is shared
    # (shared_s_per_prompt_token): both are through after the two prompts' work, 2 ms
    res = simulate_sessions(LIM, Instant(), [Turn(1000, 1)], 2, overhead_s_per_prompt_token=1e-6,
                            shared_s_per_prompt_token=1e-6)
    assert [r.first_token_s for r in res.turns[0]] == pytest.approx([0.002, 0.002], abs=1e-6)
