"""The scheduler simulation's decode-only fast path (launcher/planner/schedsim.py
``_fast_decode``: the steps in which nothing but the same decoders can run, taken at once, up to
as many as the free blocks hold) gives exactly the timeline, step count and preemptions that
taking every step one by one gives, for the plain workloads and for sessions, over generated
limits with KV pools tight enough to preempt."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar
from unittest import mock

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from launcher.planner import schedsim
from launcher.planner.schedsim import (
    SchedulerLimits,
    SessionsResult,
    SimError,
    SimResult,
    TableStepCost,
    Turn,
    Workload,
    simulate,
    simulate_sessions,
)

T = TypeVar("T")
# a step's time grows with its tokens and with the context its decoders read
TIMER = TableStepCost((1, 64, 512), (0.004, 0.006, 0.02), attn_prefill_s_per_pair=2e-9,
                      attn_decode_s_per_token=1e-7, sampler_s_per_seq=1e-5)



def stepping(run: Callable[[], T]) -> T:
    """``run`` with every step taken one by one: the decode-only fast path takes none."""
    with mock.patch.object(schedsim, "_fast_decode",
                           lambda eng, timer, now, until, last_start: (now, last_start, 0)):
        return run()


tight = st.builds(SchedulerLimits, st.integers(64, 2048), st.integers(1, 64),
                  st.integers(8, 600), st.sampled_from([1, 16]), st.booleans(), st.just(True),
                  st.sampled_from([0, 512]), st.booleans())


@settings(max_examples=100, deadline=None)
@given(lim=tight, prompt=st.integers(1, 600), gen=st.integers(1, 300),
       streams=st.integers(1, 40), per_stream=st.integers(1, 4),
       rate=st.one_of(st.none(), st.floats(1, 500)))
def test_the_fast_path_gives_the_timeline_stepping_gives(
        lim: SchedulerLimits, prompt: int, gen: int, streams: int, per_stream: int,
        rate: float | None) -> None:
    assume(-(-(prompt + gen) // lim.block_size) <= lim.kv_blocks)
    assume(lim.chunked_prefill or prompt <= lim.max_num_batched_tokens)
    work = Workload(prompt, gen, concurrency=streams, requests=streams * per_stream, rate=rate)
    timer = TIMER

    def run() -> SimResult:
        return simulate(lim, timer, work, request_overhead_s=0.001)

    try:
        fast = run()
    except SimError as e:  # a cache two decoders outgrow: the same refusal either way
        with pytest.raises(SimError, match=re.escape(str(e))):
            stepping(run)
        return
    assert fast == stepping(run)


@settings(max_examples=60, deadline=None)
@given(lim=tight, sessions=st.integers(1, 12), new=st.integers(1, 300), gen=st.integers(1, 80),
       think=st.one_of(st.none(), st.floats(0, 2)), copy=st.sampled_from([None, 1e-4]))
def test_the_sessions_fast_path_gives_the_timeline_stepping_gives(
        lim: SchedulerLimits, sessions: int, new: int, gen: int, think: float | None,
        copy: float | None) -> None:
    turns = [Turn(new + i * (new + gen), gen) for i in range(3)]
    assume(-(-(turns[-1].prompt + gen) // lim.block_size) <= lim.kv_blocks)
    assume(lim.chunked_prefill or turns[-1].prompt <= lim.max_num_batched_tokens)
    timer = TIMER

    def run() -> SessionsResult:
        return simulate_sessions(lim, timer, turns, sessions, think_s=think,
                                 host_copy_s_per_block=copy, request_overhead_s=0.001)

    try:
        fast = run()
    except SimError as e:
        with pytest.raises(SimError, match=re.escape(str(e))):
            stepping(run)
        return
    assert fast == stepping(run)
