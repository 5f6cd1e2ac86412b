"""A 16k prompt beside decoders, as vLLM 0.26's scheduler runs it (issue 22, 16k prompts four at
once): the running requests take the step's budget first (vllm/v1/core/sched/scheduler.py
``Scheduler.schedule``: RUNNING, then WAITING), so a 16,384-token prompt, two whole 8,192-token
steps alone, leaves its last tokens to a third step when a decoder rides along; a prompt waiting
when that step is chosen fills it with its own first chunk, and the first prompt's first token
comes a whole chunk step later. The thirteenth H200 table's 16k four-at-once records turn on it
(benchmarks/gpu/issue22_simwaves.py --scenario long16-c4: a wave's ends)."""

from __future__ import annotations

import itertools

import pytest

from launcher.planner.schedsim import SchedulerLimits, StepBatch, Workload, simulate

CHUNK_S, SMALL_S = 0.1, 0.01  # a step with a prompt chunk; one of decoders and a few tokens


class ChunkOrSmall:
    def step_s(self, batch: StepBatch) -> float:
        return CHUNK_S if batch.prefill_tokens > 100 else SMALL_S


def run(arrivals: tuple[float, ...], *, async_scheduling: bool) -> list[float]:
    """TTFTs of 16,384-token prompts sent at ``arrivals`` (each decoding 100 tokens after)."""
    lim = SchedulerLimits(8192, 256, 100_000, async_scheduling=async_scheduling)
    res = simulate(lim, ChunkOrSmall(), Workload(16384, 100, arrivals=arrivals))
    return [r.ttft_s for r in sorted(res.requests, key=lambda r: r.sent_s)]


def test_a_16k_prompt_alone_is_two_whole_chunk_steps() -> None:
    assert run((0.0,), async_scheduling=False) == pytest.approx([2 * CHUNK_S])


def test_beside_a_decoder_its_last_tokens_take_a_third_step() -> None:
    # A decodes from 0.2; B comes in at 0.25: 8,191 + 8,191 tokens (A takes one a step), then
    # its last 2 with A's decode in a small step
    ttft = run((0.0, 0.25, 5.0), async_scheduling=False)
    assert ttft[1] == pytest.approx(2 * CHUNK_S + SMALL_S)


def test_a_prompt_waiting_for_that_step_fills_it_and_the_first_token_waits_a_chunk() -> None:
    # C sent at 0.35, before B's third step (0.45): C's first chunk (8,189 tokens) fills it
    early = run((0.0, 0.25, 0.35), async_scheduling=False)
    late = run((0.0, 0.25, 0.50), async_scheduling=False)
    assert early[1] == pytest.approx(3 * CHUNK_S)
    assert late[1] == pytest.approx(2 * CHUNK_S + SMALL_S)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_next_prompts_arrival_decides_by_a_chunk_step(async_scheduling: bool) -> None:
    # the earlier the next prompt arrives, never the sooner the one before it gets its first
    # token, and between arriving with B and long after B's prompt is done B's TTFT moves by
    # one chunk step less the small step it would have had
    b = [run((0.0, 0.25, 0.25 + d), async_scheduling=async_scheduling)[1]
         for d in (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 1.0)]
    assert all(x >= y - 1e-9 for x, y in itertools.pairwise(b))
    assert b[0] - b[-1] == pytest.approx(CHUNK_S - SMALL_S)
