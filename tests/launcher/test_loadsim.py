"""The roofline plan's load at the asked concurrency, through the simulated scheduler
(launcher/planner/loadsim.py): requests sent together wait for each other's prompt chunks."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.engine.planfile import plan_from_json, plan_to_json
from launcher.engine.render import render
from launcher.errors import PlanError
from launcher.model.modelspec import ModelSpec, load_model_spec
from launcher.planner import costmodel, loadsim
from launcher.planner.layouts import Links, Shape, best_candidate
from launcher.planner.loadsim import RooflineStep, SimulatedPrediction
from launcher.planner.plan import Plan, Policy, plan
from launcher.planner.schedsim import SchedulerLimits, StepBatch, Workload, simulate
from launcher.probe.topology import Topology, load_topology
from tests.launcher.paths import H200, REPO, TOPOLOGIES

MODELS = REPO / "benchmarks" / "gpu" / "models"
FIXTURE = REPO / "tests" / "fixtures" / "h200-load.json"


def spec(name: str) -> ModelSpec:
    return load_model_spec(str(MODELS / name))


def topology(kind: str = "nvlink") -> Topology:
    if kind == "nvlink":
        return load_topology(str(H200), {})
    return load_topology(str(TOPOLOGIES / "h200x2-p2p-disabled.toposerve.json"), {})


def one_gpu_plan(model: str, *, prompt: int, gen: int, concurrency: int, util: float = 0.9,
                 tp: int = 1, pp: int = 1, kind: str = "nvlink") -> Plan:
    return plan(topology(kind), spec(model), Policy(
        workload="throughput", concurrency=concurrency, prompt_tokens=prompt, gen_tokens=gen,
        force_tp=tp, force_pp=pp, force_dp=1, gpu_memory_utilization=util))


def loaded(p: Plan) -> SimulatedPrediction:
    assert isinstance(p.predicted, SimulatedPrediction), p.reasons
    return p.predicted


def test_four_long_prompts_at_once_wait_for_each_others_chunks() -> None:
    # 4 x 16k tokens through an 8,192-token budget: the last prompt's first token comes about
    # eight chunks in, not after its own two (H200: 3.09 s p50 against 1.38 s alone)
    p = one_gpu_plan("gemma-3-27b-shape", prompt=16384, gen=128, concurrency=4)
    got = loaded(p)
    assert got.ttft_p50_s > 1.4 * got.ttft_s
    assert got.ttft_p90_s > got.ttft_p50_s
    assert got.load_concurrency == 4
    assert any("simulated vLLM scheduler" in r for r in p.reasons)


def test_thirty_two_streams_wait_longer_for_a_first_token_than_one() -> None:
    one = loaded(one_gpu_plan("qwen2.5-7b-shape", prompt=512, gen=256, concurrency=1))
    many = loaded(one_gpu_plan("qwen2.5-7b-shape", prompt=512, gen=256, concurrency=32))
    assert many.ttft_p50_s > 3 * one.ttft_p50_s
    assert many.tpot_p50_s > one.tpot_p50_s
    # one request alone: the closed formula's single-stream figures, which stay as they were
    assert one.ttft_p50_s == pytest.approx(one.ttft_s, rel=0.01)
    assert 1 / one.tpot_p50_s == pytest.approx(one.decode_tok_s, rel=0.05)


def test_the_load_is_loadgens_closed_loop_of_four_requests_a_stream() -> None:
    # a stream's next request is sent when its last ends (the later ones reach an engine still
    # decoding), four a stream as loadgen measures by default; the plan says so
    p = one_gpu_plan("qwen2.5-7b-shape", prompt=512, gen=256, concurrency=32)
    got = loaded(p)
    assert got.load_requests == 4 * 32
    assert got.sim_throughput_tok_s == pytest.approx(got.throughput_tok_s, rel=0.25)
    assert any("4 requests back to back" in r for r in p.reasons)


def test_a_step_is_timed_by_the_roofline_terms() -> None:
    m = spec("qwen2.5-7b-shape")
    cand, lay = best_candidate(m, Policy(force_tp=1, force_pp=1, force_dp=1),
                               Links(topology()), topology().gpus, Shape(1, 1, 1))
    assert lay is not None
    step = RooflineStep(m, lay)
    assert step.step_s(StepBatch(decode_seqs=8, decode_context=8 * 600)) == \
        costmodel.decode_step_s(m, lay, 8, 600)
    # a chunk that samples no token (not a prompt's last) runs no LM-head row
    assert step.step_s(StepBatch(prefill_tokens=512, prefill_pairs=512 * 513 / 2)) == \
        costmodel.prefill_step_s(m, lay, 512, pairs=512 * 513 / 2, sampled=0)
    # a lone prompt inside the budget: one step, the closed formula's time to first token (the
    # same prefill model, and the host's way in and out)
    lim = SchedulerLimits(8192, 256, 100_000)
    run = simulate(lim, step, Workload(512, 4),
                   request_overhead_s=costmodel.request_host_s(lay.host, 512))
    assert cand.predicted is not None
    assert run.ttft.p50 == pytest.approx(cand.predicted.ttft_s, rel=1e-6)


def test_pipeline_parallel_keeps_the_closed_formula_and_says_so() -> None:
    p = one_gpu_plan("llama-3.3-70b-shape", prompt=512, gen=256, concurrency=32, pp=2)
    assert not isinstance(p.predicted, SimulatedPrediction)
    assert any("not simulated for pipeline-parallel" in r for r in p.reasons)


def test_a_plan_file_keeps_the_load_figures() -> None:
    p = one_gpu_plan("llama-3.1-8b-longctx-shape", prompt=16384, gen=128, concurrency=4,
                     util=0.3)
    d = plan_to_json(p, render(p, "m", served_name=None, host="h", port=1))
    back = plan_from_json(json.loads(json.dumps(d)))
    got = loaded(back)
    assert got.ttft_p50_s == pytest.approx(loaded(p).ttft_p50_s, abs=1e-4)
    assert got.load_requests == 16  # 4 streams, 4 requests each, as loadgen sends by default
    # a plan file of an earlier release, without them, reads as before
    for k in ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "load_concurrency", "load_requests",
              "sim_throughput_tok_s"):
        del d["predicted"][k]
    assert not isinstance(plan_from_json(d).predicted, SimulatedPrediction)


# ------------------------------------------------------------------ the recorded H200 runs

CASES: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["cases"]
# The bound the recorded runs support (docs/planner.md, "Load through the simulated
# scheduler"): the simulated TTFT p50 within a factor of 2.5 of loadgen's, and nearer to it than
# the one-request TTFT every plan gave before wherever more than one stream ran. Its known
# bias: at 32 streams of 512 tokens on one GPU it is 15-55% low, the small models most (the
# records' cold first waves and the API server's way in under load; the first arrival running
# a step alone is simulated, docs/planner.md "A burst's first tokens").
FACTOR = 2.5


def _log_err(pred: float, measured: float) -> float:
    return abs(math.log(pred / measured))


@pytest.mark.parametrize("case", CASES, ids=[c["source"].split("results/")[1] for c in CASES])
def test_recorded_h200_load_within_the_bound(case: dict[str, Any]) -> None:
    p = one_gpu_plan(case["model"], prompt=case["prompt"], gen=case["gen"],
                     concurrency=case["concurrency"], util=case["gpu_memory_utilization"],
                     tp=case["tp"], kind=case["topology"])
    got, seen = loaded(p), case["measured"]
    assert _log_err(got.ttft_p50_s, seen["ttft_p50_s"]) < math.log(FACTOR)
    if seen["tpot_p50_s"] is not None:
        assert _log_err(got.tpot_p50_s, seen["tpot_p50_s"]) < math.log(FACTOR)
    if case["concurrency"] > 1:
        assert _log_err(got.ttft_p50_s, seen["ttft_p50_s"]) < _log_err(got.ttft_s,
                                                                        seen["ttft_p50_s"])


def test_a_kernel_tables_plan_times_its_load_with_the_table() -> None:
    from launcher.planner.kernelcost import step_shape
    from tests.launcher.test_kernels import table_like

    m = spec("qwen2.5-7b-shape")
    name = topology().gpus[0].name

    def with_table(scale: float) -> Plan:
        tables = tuple(table_like(step_shape(m, tp), name, scale) for tp in (1, 2))
        return plan(topology(), m, Policy(workload="throughput", concurrency=32, kernels=tables,
                                          force_tp=1, force_pp=1, force_dp=1))

    fast, slow = with_table(0.1), with_table(1.0)
    assert any("timed by the measured kernel table" in r for r in fast.reasons)
    assert loaded(slow).ttft_p50_s > loaded(fast).ttft_p50_s


LOAD_KEYS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "load_concurrency", "load_requests",
             "sim_throughput_tok_s")
_PLAN = one_gpu_plan("qwen2.5-7b-shape", prompt=512, gen=256, concurrency=8)
_SAVED = plan_to_json(_PLAN, render(_PLAN, "m", served_name=None, host="h", port=1))


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(LOAD_KEYS),
                       st.none() | st.booleans() | st.integers(-5, 10**6)
                       | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=5)
                       | st.lists(st.integers(), max_size=2)))
def test_a_plan_files_load_figures_read_back_or_are_refused_in_one_line(
        load: dict[str, object]) -> None:
    d = json.loads(json.dumps(_SAVED))
    for k in LOAD_KEYS:
        del d["predicted"][k]
    d["predicted"].update(load)

    def fine(k: str, v: object) -> bool:
        if isinstance(v, bool):
            return False
        if k.startswith("load_"):
            return isinstance(v, int) and v >= 1
        return isinstance(v, (int, float)) and math.isfinite(v)

    if load and not (len(load) == len(LOAD_KEYS) and all(fine(k, v) for k, v in load.items())):
        with pytest.raises(PlanError, match="|".join(LOAD_KEYS)) as e:
            plan_from_json(d)
        assert "\n" not in str(e.value)
        return
    got = plan_from_json(d).predicted
    assert isinstance(got, SimulatedPrediction) == bool(load)


def test_a_median_on_the_step_between_waves_of_first_tokens_is_said_with_its_span() -> None:
    # 128 first tokens in four waves, the median at the edge of a small one (the ninth H200
    # table's 4-bit model at 32 streams): a run's p50 may land a wave earlier or later
    waves = [0.1] * 4 + [0.44] * 9 + [0.76] * 45 + [1.11] * 15 + [1.4] * 55
    line = loadsim.median_step(waves)
    assert "sits on a step between waves" in line
    assert "760 ms to 1400 ms" in line, line


@given(st.floats(0.01, 10.0), st.lists(st.floats(-0.1, 0.1), min_size=1, max_size=200))
def test_first_tokens_all_within_10_percent_of_one_time_get_no_clause(
    around: float, spread: list[float]
) -> None:
    assert loadsim.median_step([around * (1 + d) for d in spread]) == ""


def test_a_steady_stream_of_first_tokens_has_no_step() -> None:
    assert loadsim.median_step([0.2 + 0.001 * i for i in range(128)]) == ""
