"""vLLM's way from a burst of requests to their first tokens, against timelines known exactly:
the API server hands requests over one at a time, so an idle engine core starts on the first
alone; under async scheduling the engine core launches the next step before it takes the running
step's output (vllm/v1/engine/core.py ``step_with_batch_queue``; the single-process executor
launches inline), so an eager step's launch holds back the step before's first tokens and the
choice of the step after. And a recorded trace of sends replays through the same scheduler."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from launcher.planner.schedsim import (
    LaunchTimer,
    SchedulerLimits,
    StepBatch,
    Workload,
    simulate,
)

ASYNC = SchedulerLimits(max_num_batched_tokens=8192, max_num_seqs=256, kv_blocks=10_000,
                        async_scheduling=True)
SYNC = SchedulerLimits(max_num_batched_tokens=8192, max_num_seqs=256, kv_blocks=10_000)
PREFILL_S, DECODE_S = 0.100, 0.010


@dataclass(frozen=True)
class Steps:
    """A step with prompt chunks takes PREFILL_S, one of decoders only DECODE_S."""

    def step_s(self, batch: StepBatch) -> float:
        return PREFILL_S if batch.prefill_tokens else DECODE_S


@dataclass(frozen=True)
class Launching(Steps):
    """The same steps, an eager one (with prompt chunks) launched by the host in ``eager_s``;
    one of decoders only replays a CUDA graph at once."""

    eager_s: float

    def launch_s(self, batch: StepBatch) -> float:
        return self.eager_s if batch.prefill_tokens else 0.0


def first_tokens(lim: SchedulerLimits, timer: Steps, sends: tuple[float, ...],
                 serial_s: float = 0.0) -> list[float]:
    res = simulate(lim, timer, Workload(16, 3, arrivals=sends), request_serial_s=serial_s)
    return [r.first_token_s for r in sorted(res.requests, key=lambda r: r.sent_s)]


def test_a_launch_as_long_as_its_step_holds_the_step_befores_first_token_back_a_step() -> None:
    # A alone in step 1 (0-0.1 s); B, sent at 0.05 s, is there when the engine core, done
    # launching step 1 at 0.1 s, chooses step 2: B's prompt runs in it (0.1-0.2 s), and A's
    # first token goes out only once step 2 is launched (0.2 s), as B's when step 3 (a graph
    # replay) is (0.2 s)
    assert isinstance(Launching(PREFILL_S), LaunchTimer)
    assert first_tokens(ASYNC, Launching(PREFILL_S), (0.0, 0.05)) == pytest.approx([0.2, 0.2])


def test_an_instant_launch_chooses_the_next_step_as_the_running_one_starts() -> None:
    # step 2 was chosen at 0 s, before B came: it only decodes A (0.1-0.11 s), and B's prompt
    # waits for step 3 (0.11-0.21 s); A's first token leaves as its step ends
    assert first_tokens(ASYNC, Steps(), (0.0, 0.05)) == pytest.approx([0.1, 0.21])
    assert first_tokens(ASYNC, Launching(0.0), (0.0, 0.05)) == pytest.approx([0.1, 0.21])


def test_a_short_launch_holds_nothing_back_where_the_step_before_outlasts_it() -> None:
    # launched in 0.03 s: step 2 is chosen at 0.03 s (B not there yet: it decodes A alone) and
    # step 1's output is ready at 0.1 s, after the launch; step 3 chosen at 0.1 s holds B
    assert first_tokens(ASYNC, Launching(0.03), (0.0, 0.05)) == pytest.approx([0.1, 0.21])


def test_without_async_scheduling_the_launch_changes_nothing() -> None:
    # the engine core takes each step's output before it chooses the next one
    assert first_tokens(SYNC, Launching(PREFILL_S), (0.0, 0.05)) == \
        first_tokens(SYNC, Steps(), (0.0, 0.05)) == pytest.approx([0.1, 0.2])


def test_a_recorded_trace_of_sends_at_one_moment_is_the_closed_loops_first_burst() -> None:
    burst = simulate(ASYNC, Launching(0.02), Workload(512, 8, concurrency=20, requests=20))
    trace = simulate(ASYNC, Launching(0.02), Workload(512, 8, arrivals=(0.0,) * 20))
    assert sorted(burst.requests, key=lambda r: r.first_token_s) == \
        sorted(trace.requests, key=lambda r: r.first_token_s)


def test_a_trace_sends_each_request_when_it_says() -> None:
    res = simulate(ASYNC, Steps(), Workload(16, 3, arrivals=(1.0, 0.0, 5.0)))
    assert sorted(r.sent_s for r in res.requests) == [0.0, 1.0, 5.0]
    # the request sent at 5 s finds an idle engine: its own prefill step, then two decodes
    late = max(res.requests, key=lambda r: r.sent_s)
    assert late.ttft_s == pytest.approx(PREFILL_S)
    assert late.finished_s == pytest.approx(5.0 + PREFILL_S + 2 * DECODE_S)


def test_requests_sent_together_reach_an_idle_engine_one_at_a_time() -> None:
    # handed over 10 ms apart: the first runs alone (0-0.1 s), the other two in the next step
    assert first_tokens(SYNC, Steps(), (0.0,) * 3, serial_s=0.01) == \
        pytest.approx([0.1, 0.2, 0.2])
    # all there at once: one step holds the three
    assert first_tokens(SYNC, Steps(), (0.0,) * 3) == pytest.approx([0.1, 0.1, 0.1])


def test_the_rest_of_a_burst_joins_the_step_chosen_once_the_first_is_launched() -> None:
    # the first alone is launched in 0.05 s; the next two (handed over at 0.01 and 0.02 s) are
    # in the step chosen then (0.1-0.2 s), not a step later as with an instant launch
    assert first_tokens(ASYNC, Launching(0.05), (0.0,) * 3, serial_s=0.01) == \
        pytest.approx([0.1, 0.2, 0.2])
    assert first_tokens(ASYNC, Steps(), (0.0,) * 3, serial_s=0.01) == \
        pytest.approx([0.1, 0.21, 0.21])


def test_the_front_ends_pace_adds_to_the_way_in_only_where_requests_queue_for_it() -> None:
    # sent 1 s apart, each reaches the scheduler after its own way in (0.02 s), not later
    res = simulate(SYNC, Steps(), Workload(16, 3, arrivals=(0.0, 1.0)),
                   request_overhead_s=0.02, request_serial_s=0.01)
    assert [r.ttft_s for r in sorted(res.requests, key=lambda r: r.sent_s)] == \
        pytest.approx([0.02 + PREFILL_S] * 2)


def test_a_burst_shares_the_front_ends_loop_then_goes_one_request_after_another() -> None:
    # 3 x 10 ms of the loop's shared work: all three are through it at 0.03 s; then 5 ms of
    # serial work each: handed over at 0.03, 0.035 and 0.04 s. The first runs alone
    # (0.03-0.13 s), the other two in the next step (0.13-0.23 s)
    res = simulate(SYNC, Steps(), Workload(16, 3, arrivals=(0.0,) * 3),
                   request_shared_s=0.01, request_serial_s=0.005)
    firsts = [r.first_token_s for r in sorted(res.requests, key=lambda r: r.sent_s)]
    assert sorted(firsts) == pytest.approx([0.13, 0.23, 0.23])
    # alone, a request pays its shared work once: it reaches the scheduler at 0.01 s
    lone = simulate(SYNC, Steps(), Workload(16, 3, arrivals=(0.0,)), request_shared_s=0.01)
    assert lone.requests[0].ttft_s == pytest.approx(0.01 + PREFILL_S)
    # sent 1 ms apart, the first sent is through the loop first: 1 ms alone, 1 ms with the
    # second, then shared three ways, it ends at 0.002 + 3 x 0.0085 = 0.0275 s
    apart = simulate(SYNC, Steps(), Workload(16, 3, arrivals=(0.0, 0.001, 0.002)),
                     request_shared_s=0.01)
    first = min(apart.requests, key=lambda r: r.sent_s)
    assert first.first_token_s == pytest.approx(0.0275 + PREFILL_S)


def test_a_first_token_handed_over_as_a_host_bound_step_ends_is_not_held_behind_it() -> None:
    # Steps launched as long as they run (host-bound: the launch is the whole step). A alone in
    # step 1 (0-0.1 s); step 2 (B's prompt, A's decode, 0.1-0.2 s) is launched by 0.2 s, when
    # A's first token goes out. Step 3, chosen then with C's prompt, is launched by 0.3 s: B's
    # first token goes out then, and C's as step 4 (a graph replay) starts. A's first token,
    # handed over as step 2 ended, is not step 2's output: it is not held again until step 3
    # is launched (0.3 s), nor behind every host-bound step after that
    assert first_tokens(ASYNC, Launching(PREFILL_S), (0.0, 0.05, 0.15)) == \
        pytest.approx([0.2, 0.3, 0.3])
