"""A plan's 32-stream load begins as vLLM begins a burst: the front end hands the requests over
one at a time, so the idle engine core starts on the first alone, and the engine core launches
each eager step from the host before it takes the step before's output. Every H200 32-stream
record shows the first shape (benchmarks/gpu/results/2026-12-02-h200-table3: one first token,
then 15, then 16, in both waves)."""

from __future__ import annotations

import pytest

from launcher.model.modelspec import ModelSpec, load_model_spec
from launcher.planner import hardware, loadsim
from launcher.planner.costmodel import Layout
from launcher.planner.layouts import Links, Shape, best_candidate
from launcher.planner.memfit import Fit
from launcher.planner.plantypes import Policy
from launcher.planner.schedsim import LaunchTimer, StepBatch
from launcher.probe.topology import load_topology
from tests.launcher.gpushapes import RECORDS_GRAPHS
from tests.launcher.paths import H200, REPO

MODEL = REPO / "benchmarks" / "gpu" / "models" / "qwen2.5-14b-shape"


def one_gpu(streams: int) -> tuple[ModelSpec, Layout, Fit, Policy]:
    m = load_model_spec(str(MODEL))
    topo = load_topology(str(H200), {})
    pol = Policy(workload="throughput", concurrency=streams, force_tp=1, force_pp=1,
                 force_dp=1, prompt_tokens=512, gen_tokens=256)
    # the H200 records' graphs: to 64 tokens
    cand, lay = best_candidate(m, pol, Links(topo, RECORDS_GRAPHS), list(topo.gpus),
                               Shape(1, 1, 1))
    assert lay is not None
    assert cand.fit is not None
    return m, lay, cand.fit, pol


def test_an_eager_step_is_launched_layer_by_layer_and_a_decode_step_at_once() -> None:
    m, lay, _, _ = one_gpu(32)
    step = loadsim.RooflineStep(m, lay)
    assert isinstance(step, LaunchTimer)
    own = hardware.STEP_OVERHEAD_S  # the engine core's own work a step, every launch
    assert step.launch_s(StepBatch(prefill_tokens=512, sampled=1)) == \
        pytest.approx(own + m.num_layers * lay.host.layer_launch_s)
    assert step.launch_s(StepBatch(decode_seqs=32, decode_context=32 * 600, sampled=32)) == \
        pytest.approx(own)


def test_a_burst_of_thirty_two_prompts_starts_with_the_first_alone() -> None:
    m, lay, fit, pol = one_gpu(32)
    _, run = loadsim.loadgen_run(m, lay, fit, prompt=512, gen=256, streams=32,
                                 max_num_seqs=pol.max_num_seqs)
    wave = sorted((r for r in run.requests if r.sent_s == 0.0), key=lambda r: r.first_token_s)
    assert len(wave) == 32
    alone, rest = wave[0], wave[1:]
    # its own step: as long as one prompt's, and every other first token a whole step later
    step = loadsim.RooflineStep(m, lay).step_s(StepBatch(prefill_tokens=512, sampled=1))
    # its way in: the API server's loop shares its fixed work among all 32 (schedsim._FrontEnd)
    way_in = 32 * lay.host.request_s + lay.host.request_fixed_s - lay.host.request_s \
        + 512 * lay.host.prompt_token_s
    # and the launch of the step after it, which its first token waits for under async
    # scheduling: a host-bound step's own length at most
    assert alone.ttft_s >= way_in + step
    assert alone.ttft_s <= 2 * step + way_in + 1e-9
    assert min(r.first_token_s for r in rest) > alone.first_token_s + step
    # the next step, chosen once the first was launched, holds as many as its budget takes
    firsts = sorted({round(r.first_token_s, 6) for r in rest})
    assert len(firsts) == 2
    assert sum(1 for r in rest if round(r.first_token_s, 6) == firsts[0]) == 15
