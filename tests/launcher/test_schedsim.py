"""The scheduler simulation against cases whose timeline is known exactly, and its invariants
over generated limits and workloads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.planner.schedsim import (
    SchedulerLimits,
    SimError,
    StepBatch,
    TableStepCost,
    Turn,
    Workload,
    percentiles,
    simulate,
    simulate_sessions,
)

BIG = SchedulerLimits(max_num_batched_tokens=8192, max_num_seqs=256, kv_blocks=100_000)


@dataclass
class Recorder:
    """A step timer that costs ``fixed`` plus ``per_token`` a token and keeps every batch."""

    fixed: float = 0.01
    per_token: float = 0.0
    batches: list[StepBatch] = field(default_factory=list)

    def step_s(self, batch: StepBatch) -> float:
        self.batches.append(batch)
        return self.fixed + self.per_token * batch.tokens


def test_one_short_request_is_one_prefill_step_then_one_step_per_token() -> None:
    res = simulate(BIG, Recorder(0.01), Workload(prompt=512, gen=10), request_overhead_s=0.003)
    (r,) = res.requests
    assert r.ttft_s == pytest.approx(0.013)
    assert r.tpot_s == pytest.approx(0.01)
    assert r.finished_s - r.sent_s == pytest.approx(0.003 + 10 * 0.01)
    assert res.steps == 10


def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks() -> None:
    rec = Recorder(0.01)
    res = simulate(BIG, rec, Workload(prompt=20_000, gen=2))
    assert res.requests[0].ttft_s == pytest.approx(0.03)  # 8192 + 8192 + 3616
    assert [b.prefill_tokens for b in rec.batches[:3]] == [8192, 8192, 3616]
    assert rec.batches[3].decode_seqs == 1
    assert rec.batches[3].decode_context == 20_001


def test_four_long_prompts_at_once_are_prefilled_one_after_another_through_the_budget() -> None:
    # every step full of prompt tokens: the last request's first token waits for all four
    # prompts and the three decode tokens scheduled before it, at 1 us a token
    rec = Recorder(0.0, 1e-6)
    res = simulate(BIG, rec, Workload(prompt=16_384, gen=2, concurrency=4))
    ttfts = sorted(r.ttft_s for r in res.requests)
    assert ttfts[0] == pytest.approx(16_384e-6)
    assert ttfts[-1] == pytest.approx((4 * 16_384 + 3) * 1e-6)
    assert all(b.tokens <= 8192 for b in rec.batches)


def test_max_num_seqs_caps_the_running_requests() -> None:
    lim = SchedulerLimits(8192, max_num_seqs=2, kv_blocks=10_000)
    res = simulate(lim, Recorder(0.01), Workload(prompt=100, gen=5, concurrency=8))
    assert res.max_running == 2
    assert len(res.requests) == 8
    # two at a time, five steps each: four rounds
    assert res.duration_s == pytest.approx(4 * 5 * 0.01)


def test_a_full_kv_cache_preempts_the_last_admitted_and_still_finishes_everything() -> None:
    # 3 requests of 32 + 64 tokens need 6 blocks each at their end; 14 blocks hold two
    lim = SchedulerLimits(8192, 256, kv_blocks=14)
    res = simulate(lim, Recorder(0.01), Workload(prompt=32, gen=64, concurrency=3))
    assert res.preemptions > 0
    assert len(res.requests) == 3
    assert all(r.gen == 64 for r in res.requests)


def test_a_shared_prefix_is_taken_from_the_cache_in_whole_blocks() -> None:
    rec = Recorder(0.0, 1e-6)
    work = Workload(prompt=1000, gen=2, concurrency=1, requests=2, shared_prefix=500)
    res = simulate(BIG, rec, work)
    assert [r.cached_tokens for r in res.requests] == [0, 496]
    assert rec.batches[2].prefill_tokens == 1000 - 496
    off = simulate(SchedulerLimits(8192, 256, 100_000, prefix_caching=False), Recorder(), work)
    assert [r.cached_tokens for r in off.requests] == [0, 0]


def test_closed_loop_sends_the_next_request_when_the_last_ends() -> None:
    res = simulate(BIG, Recorder(0.01), Workload(prompt=64, gen=4, concurrency=1, requests=3),
                   request_overhead_s=0.005)
    assert [r.sent_s for r in res.requests] == pytest.approx([0.0, 0.045, 0.09])
    assert res.output_tok_s == pytest.approx(12 / 0.135)


def test_open_loop_sends_at_the_rate_whatever_the_engine_does() -> None:
    res = simulate(BIG, Recorder(0.01), Workload(prompt=64, gen=4, requests=3, rate=10.0))
    assert [r.sent_s for r in res.requests] == pytest.approx([0.0, 0.1, 0.2])
    assert all(r.ttft_s == pytest.approx(0.01) for r in res.requests)


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room_for_all_of_it() -> None:
    lim = SchedulerLimits(1000, 256, 10_000, chunked_prefill=False)
    rec = Recorder(0.01)
    res = simulate(lim, rec, Workload(prompt=600, gen=3, concurrency=2))
    assert [b.prefill_tokens for b in rec.batches[:2]] == [600, 600]
    assert sorted(r.ttft_s for r in res.requests) == pytest.approx([0.01, 0.02])


def test_one_request_larger_than_the_cache_is_one_error() -> None:
    with pytest.raises(SimError, match="more than the KV cache"):
        simulate(SchedulerLimits(8192, 256, kv_blocks=10), Recorder(), Workload(512, 10))


def test_table_step_cost_interpolates_and_extrapolates_in_proportion() -> None:
    cost = TableStepCost((1, 100), (0.001, 0.011), attn_prefill_s_per_pair=1e-9,
                         sampler_s_per_seq=1e-4, step_overhead_s=0.002)
    assert cost.forward(1) == pytest.approx(0.001)
    assert cost.forward(50) == pytest.approx(0.001 + 0.01 * 49 / 99)
    assert cost.forward(200) == pytest.approx(0.022)
    batch = StepBatch(prefill_tokens=100, prefill_pairs=5000.0, sampled=1)
    assert cost.step_s(batch) == pytest.approx(0.002 + 0.011 + 5e-6 + 1e-4)


@pytest.mark.parametrize("bad", [((), ()), ((2, 1), (0.1, 0.2)), ((1,), (math.nan,)),
                                 ((0, 4), (0.1, 0.2)), ((1, 2), (0.1,))])
def test_a_malformed_step_table_is_refused(bad: tuple[tuple[int, ...], tuple[float, ...]]) -> None:
    with pytest.raises(SimError):
        TableStepCost(*bad)


def test_percentiles_interpolate_as_loadgen_does() -> None:
    p = percentiles([4.0, 1.0, 3.0, 2.0])
    assert (p.mean, p.p50, p.p90) == pytest.approx((2.5, 2.5, 3.7))


limits = st.builds(SchedulerLimits, st.integers(1, 4096), st.integers(1, 64),
                   st.integers(1, 4000), st.sampled_from([1, 16, 128]), st.booleans(),
                   st.booleans(), st.sampled_from([0, 64, 512]))
workloads = st.builds(Workload, st.integers(1, 3000), st.integers(1, 40), st.integers(1, 12),
                      st.integers(0, 24), st.one_of(st.none(), st.floats(0.5, 500)),
                      st.integers(0, 3000))


@given(limits, workloads)
def test_every_request_finishes_within_the_limits(lim: SchedulerLimits, work: Workload) -> None:
    rec = Recorder(0.001, 1e-6)
    too_big = -(-(work.prompt + work.gen) // lim.block_size) > lim.kv_blocks
    unchunkable = not lim.chunked_prefill and work.prompt > lim.max_num_batched_tokens
    if too_big or unchunkable:  # what vLLM itself would refuse to start with
        with pytest.raises(SimError, match=r"KV cache|without chunked prefill"):
            simulate(lim, rec, work)
        return
    res = simulate(lim, rec, work, request_overhead_s=0.002)
    assert len(res.requests) == work.total
    assert res.max_running <= lim.max_num_seqs
    assert all(b.tokens <= lim.max_num_batched_tokens for b in rec.batches)
    for r in res.requests:
        assert r.sent_s + 0.002 < r.first_token_s <= r.finished_s
        assert r.cached_tokens < work.prompt
    produced = sum(b.sampled for b in rec.batches)
    assert produced >= work.total * work.gen  # recomputed requests sample again


# ------------------------------------------------------------------- sessions taking turns


def conversation(turns: int, first: int = 2000, new: int = 4000, gen: int = 64) -> list[Turn]:
    """A conversation growing by ``new`` tokens a turn (its answer kept in the history)."""
    return [Turn(first + i * (new + gen), gen) for i in range(turns)]


def test_sessions_the_cache_holds_hit_their_prefix_and_compute_only_the_new_tokens() -> None:
    rec = Recorder(0.0, 1e-6)
    turns = conversation(4)
    res = simulate_sessions(BIG, rec, turns, 2)
    for i in range(1, 4):
        history = turns[i - 1].prompt + turns[i - 1].gen - 1  # what the last turn computed
        for r in res.turns[i]:
            assert r.cached_tokens == history // 16 * 16
    # the last turn: both sessions' new tokens (and the partial blocks) in one step, nothing of
    # the prefixes recomputed
    last = [b for b in rec.batches if b.prefill_tokens][-1]
    assert last.prefill_tokens <= 2 * (4064 + 16)
    assert res.ttft(3).p50 < 2 * (4064 + 16) * 1e-6 + 1e-9


def test_sessions_past_the_room_lose_their_prefixes_and_recompute_them() -> None:
    room = SchedulerLimits(max_num_batched_tokens=8192, max_num_seqs=256,
                           kv_blocks=-(-20_000 // 16))  # one 14k session, not two
    rec = Recorder(0.0, 1e-6)
    turns = conversation(4)
    res = simulate_sessions(room, rec, turns, 3)
    # evicted before their next turn: what is left is at most a part of the session served last
    history = turns[2].prompt
    hits = sorted(r.cached_tokens for r in res.turns[3])
    assert hits[1] < history / 2
    assert sum(hits) < history
    held = simulate_sessions(BIG, Recorder(0.0, 1e-6), conversation(4), 3)
    assert res.ttft(3).p50 > 2 * held.ttft(3).p50


def test_a_host_tier_copies_the_lost_prefixes_back_instead_of_recomputing_them() -> None:
    room = SchedulerLimits(max_num_batched_tokens=8192, max_num_seqs=256,
                           kv_blocks=-(-20_000 // 16))
    turns = conversation(4)
    recompute = simulate_sessions(room, Recorder(0.0, 1e-6), turns, 3)
    copy_s = 2e-6  # a block: cheaper than computing its 16 tokens at 1 us each
    offload = simulate_sessions(room, Recorder(0.0, 1e-6), turns, 3,
                                host_copy_s_per_block=copy_s)
    assert offload.copied_blocks > 0
    for r in offload.turns[3]:
        assert r.cached_tokens >= (turns[2].prompt + turns[2].gen - 1) // 16 * 16
        assert r.ttft_s >= (turns[2].prompt // 16) * copy_s  # it waited for its copy
    assert offload.ttft(3).p50 < recompute.ttft(3).p50
    free_copy = simulate_sessions(room, Recorder(0.0, 1e-6), turns, 3, host_copy_s_per_block=0.0)
    assert free_copy.ttft(3).p50 < offload.ttft(3).p50


def test_sessions_sending_together_queue_so_the_last_waits_longer_the_more_there_are() -> None:
    last = []
    for s in range(1, 7):
        res = simulate_sessions(BIG, Recorder(0.002, 1e-6), conversation(3), s)
        last.append(max(r.ttft_s for r in res.turns[2]))
    assert last == sorted(last)
    assert last[-1] > 3 * last[0]


def test_fast_decoding_gives_the_same_timeline_as_stepping() -> None:
    # one session: every decode step after the first is taken at once; the timeline must be
    # what stepping gives (Recorder's steps are 10 ms fixed: gen steps after the prefill)
    res = simulate_sessions(BIG, Recorder(0.01), [Turn(100, 50), Turn(300, 50)], 1,
                            request_overhead_s=0.003)
    for turn in res.turns:
        (r,) = turn
        assert r.ttft_s == pytest.approx(0.013)
        assert r.finished_s - r.sent_s == pytest.approx(0.003 + 50 * 0.01)


@given(st.integers(1, 6), st.integers(40, 4000), st.integers(1, 400), st.integers(1, 40),
       st.sampled_from([None, 0.0, 1e-4]))
def test_every_session_turn_finishes_and_hits_no_more_than_it_sent(
        sessions: int, blocks: int, new: int, gen: int, copy: float | None) -> None:
    lim = SchedulerLimits(max_num_batched_tokens=512, max_num_seqs=4, kv_blocks=blocks)
    turns = [Turn(new + i * (new + gen), gen) for i in range(3)]
    if -(-(turns[-1].prompt + gen) // 16) > blocks:
        with pytest.raises(SimError, match="KV cache"):
            simulate_sessions(lim, Recorder(), turns, sessions, host_copy_s_per_block=copy)
        return
    res = simulate_sessions(lim, Recorder(), turns, sessions, host_copy_s_per_block=copy)
    for t, rs in zip(turns, res.turns, strict=True):
        assert len(rs) == sessions
        for r in rs:
            assert 0 <= r.cached_tokens < t.prompt
            assert r.sent_s < r.first_token_s <= r.finished_s


ASYNC = SchedulerLimits(max_num_batched_tokens=8192, max_num_seqs=256, kv_blocks=100_000,
                        async_scheduling=True)


def test_with_async_scheduling_a_request_arriving_mid_step_waits_for_the_step_after_next() -> None:
    # 10 ms steps; A alone from 0 (prefill 0-10 ms, decodes after), B sent at 15 ms, mid-step 2.
    # Without async scheduling step 3 (20-30 ms) is chosen when step 2 ends and takes B; with
    # it, step 3 was chosen as step 2 began (10 ms), so B's prompt runs in step 4 (30-40 ms)
    work = Workload(prompt=512, gen=6, rate=1 / 0.015, requests=2)
    sync = simulate(BIG, Recorder(0.01), work).requests
    late = simulate(ASYNC, Recorder(0.01), work).requests
    assert [r.ttft_s for r in sync] == pytest.approx([0.01, 0.015])
    assert [r.ttft_s for r in late] == pytest.approx([0.01, 0.025])
    # the sessions' loop (with its decode-only fast path) gives the same timeline
    sess = simulate_sessions(ASYNC, Recorder(0.01), [Turn(512, 6)], 2, think_s=0.03)
    assert [t.ttft_s for t in sess.turns[0]] == pytest.approx([0.01, 0.025])


def test_async_scheduling_leaves_a_burst_on_an_idle_engine_as_it_was() -> None:
    # everything arrived before the first step: each step is chosen from the same queue
    for work in (Workload(prompt=512, gen=4, concurrency=32),
                 Workload(prompt=16_384, gen=2, concurrency=4),
                 Workload(prompt=512, gen=10)):
        sync = simulate(BIG, Recorder(0.0, 1e-6), work).requests
        late = simulate(ASYNC, Recorder(0.0, 1e-6), work).requests
        assert [r.ttft_s for r in late] == pytest.approx([r.ttft_s for r in sync])


@pytest.mark.parametrize("blocks", [600, 1000, 3000])
def test_a_burst_preempted_in_a_tight_cache_runs_alike_in_both_loops(blocks: int) -> None:
    # a preempted request finds its own blocks again in either loop (vLLM's prefix cache keeps
    # them until another request takes them), so the two loops give one timeline
    lim = SchedulerLimits(2048, 256, blocks)
    plain = simulate(lim, Recorder(0.01, 1e-5), Workload(4000, 50, concurrency=32))
    sess = simulate_sessions(lim, Recorder(0.01, 1e-5), [Turn(4000, 50)], 32)
    assert plain.preemptions == sess.preemptions
    assert sorted(r.ttft_s for r in plain.requests) == pytest.approx(
        sorted(t.ttft_s for t in sess.turns[0]))
