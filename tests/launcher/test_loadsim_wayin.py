"""A request's way in is charged once in loadgen's simulated run (issue 22): loadsim hands the
simulation the whole way in (``request_overhead_s``: the host profile's request and prompt-token
work and the first token's way out) and, of the API server loop's part of it, the share a burst
shares and the share it hands over one request at a time (hardware.loop_split). A request alone
pays the way in once; a burst's first request pays the others' shared share besides, never
their whole way in."""

from __future__ import annotations

import pytest

from launcher.model.modelspec import ModelSpec
from launcher.planner import hardware, loadsim
from launcher.planner.costmodel import Layout
from launcher.planner.schedsim import StepBatch
from tests.launcher.test_loadsim_burst import one_gpu

LONG = 16384
BUDGET = 8192


def chunk(new: int, computed: int, *, sampled: int) -> StepBatch:
    """A prompt chunk of ``new`` tokens after ``computed`` of them (schedsim._batch's pairs)."""
    return StepBatch(prefill_tokens=new, prefill_pairs=new * (computed + (new + 1) / 2),
                     sampled=sampled)


def two_chunks(m: ModelSpec, lay: Layout) -> float:
    """A 16k prompt's two GPU-bound chunk steps (their launches hide behind the GPU's work, so
    no first token waits for the next launch)."""
    timer = loadsim.RooflineStep(m, lay)
    return (timer.step_s(chunk(BUDGET, 0, sampled=0))
            + timer.step_s(chunk(BUDGET, BUDGET, sampled=1)))


def test_a_request_alone_pays_its_way_in_once() -> None:
    m, lay, fit, pol = one_gpu(1)
    _, run = loadsim.loadgen_run(m, lay, fit, prompt=LONG, gen=2, streams=1,
                                 max_num_seqs=pol.max_num_seqs)
    way_in = lay.host.request_fixed_s + LONG * lay.host.prompt_token_s
    assert run.requests[0].ttft_s == pytest.approx(way_in + two_chunks(m, lay), rel=1e-9)


def test_a_bursts_first_request_pays_the_others_shared_share_and_no_more() -> None:
    m, lay, fit, pol = one_gpu(4)
    _, run = loadsim.loadgen_run(m, lay, fit, prompt=LONG, gen=2, streams=4,
                                 max_num_seqs=pol.max_num_seqs)
    first = min((r for r in run.requests if r.sent_s == 0.0), key=lambda r: r.first_token_s)
    way_in = lay.host.request_fixed_s + LONG * lay.host.prompt_token_s
    shared, _ = hardware.loop_split(lay.host.request_s + LONG * lay.host.prompt_token_s)
    assert first.ttft_s == pytest.approx(way_in + 3 * shared + two_chunks(m, lay), rel=1e-9)
