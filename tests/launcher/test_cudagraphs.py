"""The served vLLM's CUDA graphs, in one place (launcher/planner/cudagraphs.py), and every step
timer running a step as those graphs run it: vLLM's default capture sizes, a step padded to the
next captured size, piecewise graphs for prompt steps within the range (the attention between
the pieces launched from Python), and every step past the range eager, decoders only or not,
on the roofline and the kernel-table path alike."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.planner import costmodel, cudagraphs, hardware, loadsim
from launcher.planner.cudagraphs import EAGER, CudaGraphs, Requested, default_sizes
from launcher.planner.hardware import SERVER_HOST, LayerHost
from launcher.planner.kernelcost import HostBound
from launcher.planner.plantypes import Policy
from launcher.planner.schedsim import StepBatch, TableStepCost
from launcher.probe.topology import load_topology
from tests.launcher.gpushapes import one_gpu, spec

# what the lent H200's vLLM 0.26 logged at start-up with no graph flags (max_num_seqs 256):
# benchmarks/gpu/results/2026-12-02-h200-table3/smollm2-default/logs/vllm-18610.log
H200_LOGGED = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))


def test_vllms_default_capture_sizes_are_the_ones_the_h200_logged() -> None:
    assert Requested().on().sizes == H200_LOGGED
    assert cudagraphs.VLLM_DEFAULT.max_tokens == Policy().graph_steps == 512


def test_the_default_range_follows_max_num_seqs_the_budget_and_blackwell() -> None:
    assert Requested(max_num_seqs=16).on().max_tokens == 32 == Policy(max_num_seqs=16).graph_steps
    assert Requested(max_num_seqs=12).on().sizes[-2:] == (16, 24)  # 12 itself is appended
    assert 12 in Requested(max_num_seqs=12).on().sizes
    assert Requested(batched_tokens=300).on().max_tokens == 300
    # data-centre Blackwell's ceiling is 1024, still at most 2 x max_num_seqs
    assert Requested(max_num_seqs=1024).on([(10, 0)]).max_tokens == 1024
    assert Requested().on([(10, 0)]).max_tokens == 512
    assert Requested(max_num_seqs=1024).on([(10, 0), (9, 0)]).max_tokens == 512
    # the flags' range wins; 0 is --enforce-eager
    assert Requested(64).on([(10, 0)]).sizes == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert Requested(0).on().sizes == ()


def test_a_step_is_padded_to_the_next_captured_size_within_the_range_only() -> None:
    g = CudaGraphs(default_sizes(512))
    assert [g.padded(n) for n in (1, 3, 9, 257, 512, 513)] == [1, 4, 16, 272, 512, 513]


def test_decoders_replay_a_full_graph_prompts_piecewise_and_past_the_range_both_run_eagerly(
) -> None:
    g = CudaGraphs(default_sizes(64))
    assert g.mode(0, 64) == "full"
    assert g.mode(10, 64) == "piecewise"
    assert g.mode(0, 65) == g.mode(10, 65) == "eager"
    assert EAGER.mode(0, 1) == "eager"


def test_the_host_launches_each_kind_of_step_by_one_rule() -> None:
    g = CudaGraphs(default_sizes(64))
    h = SERVER_HOST
    ref = h.reference_layer
    # every launch is the engine core's own work a step (what a step's outputs wait for under
    # async scheduling), and the layers' launches where the graphs do not hold them
    own = hardware.STEP_OVERHEAD_S
    assert ref.launch_s(10, g, 0, 32) == pytest.approx(own)
    assert ref.launch_s(10, g, 16, 32) == pytest.approx(own + 10 * h.piecewise_layer_s)
    assert ref.launch_s(10, g, 0, 65) == pytest.approx(own + 10 * h.layer_launch_s)
    assert ref.launch_s(10, g, 65, 65) == pytest.approx(own + 10 * h.layer_launch_s)
    assert h.piecewise_layer_s == pytest.approx(hardware.PIECEWISE_HOST_SHARE * h.layer_launch_s)
    # no graphs (--enforce-eager, the CPU engine): every step launched layer by layer
    assert ref.launch_s(10, EAGER, 0, 1) == pytest.approx(own + 10 * h.layer_launch_s)


def test_a_small_models_prompt_within_the_range_is_bound_by_the_pieces_host_work() -> None:
    # SmolLM2's 512-token prompt on one H200: past the range each layer takes the eager host
    # floor and the GPU's eager cost; within it the layer's piece replays and attention, and
    # the GPU's arithmetic without an eager launch's own cost
    m = spec("smollm2-1.7b-shape")
    lay = one_gpu(m, cudagraphs.VLLM_RULE)
    assert lay.graphs.max_tokens == 512
    eager = costmodel.prefill_step_s(m, one_gpu(m), 512)  # the records' graphs to 64
    graphs = costmodel.prefill_step_s(m, lay, 512)
    assert eager == pytest.approx(
        m.num_layers * costmodel.eager_host_layer_s(m, lay.host) + hardware.STEP_OVERHEAD_S)
    assert graphs == pytest.approx(
        m.num_layers * lay.host.piecewise_layer_s + hardware.STEP_OVERHEAD_S)
    assert graphs < eager


def test_a_graph_steps_gemms_run_the_padded_rows() -> None:
    # a large model's prompt step is bound by its arithmetic: 257 tokens run 272 rows
    m = spec("qwen2.5-32b-shape")
    lay = one_gpu(m, cudagraphs.VLLM_RULE)
    padded = costmodel.prefill_step_s(m, lay, 257, sampled=0)
    assert padded == pytest.approx(costmodel.prefill_step_s(m, lay, 272, sampled=0), rel=0.02)
    assert padded > costmodel.prefill_step_s(m, lay, 256, sampled=0) * 1.04


def test_decoders_past_the_range_run_eagerly_on_the_roofline_and_the_table_alike() -> None:
    m = spec("smollm2-1.7b-shape")
    lay = one_gpu(m, Requested(16))
    within, past = (StepBatch(decode_seqs=n, decode_context=n * 600, sampled=n) for n in (16, 32))
    roof = loadsim.RooflineStep(m, lay)
    own = hardware.STEP_OVERHEAD_S  # the engine core's own work, every step
    launch = own + m.num_layers * lay.host.layer_launch_s
    assert roof.launch_s(within) == pytest.approx(own)
    assert roof.launch_s(past) == pytest.approx(launch)
    # the eager decode step takes at least the eager layers' host launch, as a prompt's does
    assert roof.step_s(past) >= m.num_layers * costmodel.eager_host_layer_s(m, lay.host)
    assert roof.step_s(within) < m.num_layers * costmodel.eager_host_layer_s(m, lay.host)
    cost = TableStepCost(tokens=(1, 1024), forward_s=(1e-4, 1e-3),
                         eager_forward_s=(2e-4, 2e-3), max_graph_tokens=16)
    table = HostBound(cost, lay.host, layers=m.num_layers, graphs=lay.graphs)
    assert table.launch_s(within) == pytest.approx(own)
    assert table.launch_s(past) == pytest.approx(launch)
    assert cost.forward(32) == pytest.approx(2e-3 * 32 / 1024 + 2e-4 * (1 - 31 / 1023),
                                             rel=0.05)


def test_the_tables_piecewise_step_is_padded_and_bound_by_the_pieces_host_work() -> None:
    cost = TableStepCost(tokens=(1, 1024), forward_s=(1e-5, 1.024e-2))
    timer = HostBound(cost, replace(SERVER_HOST, step_s=0.0, seq_step_s=0.0), layers=10,
                      graphs=CudaGraphs(default_sizes(512)),
                      layer=LayerHost(SERVER_HOST.layer_launch_s, 1e-5))
    # 257 tokens run as 272 (the forward's), the host's launch (the engine core's own work
    # and the pieces, 10 x 10 us) below it
    assert timer.step_s(StepBatch(prefill_tokens=257, sampled=0)) == pytest.approx(
        cost.forward(272))
    slow = replace(timer, layer=LayerHost(SERVER_HOST.layer_launch_s, 1e-3))
    assert slow.step_s(StepBatch(prefill_tokens=257, sampled=0)) == pytest.approx(
        hardware.STEP_OVERHEAD_S + 10e-3)


def test_the_plans_flags_decide_the_graphs_its_layouts_run_under() -> None:
    from launcher.planner.layouts import Links
    from tests.launcher.gpushapes import topology

    topo = topology()
    assert Links(topo).graphs == cudagraphs.VLLM_RULE
    assert Policy(graph_tokens=64).cuda_graphs.on().max_tokens == 64
    assert Policy(max_num_seqs=8).cuda_graphs.on().max_tokens == 16


def test_the_agent_plans_rooms_run_under_the_plans_graphs() -> None:
    # the user's graph flags (--cuda-graph-sizes 64, Policy.graph_tokens) reach every room's
    # layout, whose steps and launches the agent plan times, as they reach the plan's own
    from launcher.pipeline.run import plan_with_agent
    from launcher.planner.agent import AgentAsk
    from tests.launcher.paths import topo

    m = spec("llama-3.2-3b-shape")
    for policy, top in ((Policy(graph_tokens=64), 64), (Policy(), 512)):
        _, ap = plan_with_agent(load_topology(topo("2x3090-p2p-x16"), {}), m, policy,
                                AgentAsk(2, 4000), None)
        assert ap is not None
        assert ap.rooms
        for r in ap.rooms:
            assert r.lay is not None
            assert r.lay.graphs.max_tokens == top


@pytest.mark.parametrize("name", ["deepseek-v2-lite-shape", "qwen3-30b-a3b-shape",
                                  "gemma-3-12b-shape", "smollm2-1.7b-shape"])
def test_a_steps_launch_is_the_host_work_its_step_is_floored_by(name: str) -> None:
    # the engine core's launching of a step and the step's own host floor are the same Python
    # work a layer (family extras and all: a fused-MoE op's dispatch, DeepSeek's MLA path), so
    # a host-bound step lasts its launch (the engine core's own work a step with it), eager or
    # piecewise, on the roofline and on a kernel table alike
    m = spec(name)
    lay = one_gpu(m, Requested(64))
    roof = loadsim.RooflineStep(m, lay)
    for batch in (StepBatch(prefill_tokens=128, sampled=1),  # past the range: eager
                  StepBatch(prefill_tokens=8, sampled=1)):  # within it: piecewise (the
        # MoE's routed experts' weights at 32 rows outlast its pieces' host work)
        assert roof.launch_s(batch) > 0
        assert roof.launch_s(batch) == pytest.approx(roof.step_s(batch), rel=1e-6)
    mine = costmodel.layer_host(m, lay.host)
    assert roof.launch_s(StepBatch(prefill_tokens=128, sampled=1)) == pytest.approx(
        mine.engine_step_s(128) + m.num_layers * costmodel.eager_host_layer_s(m, lay.host))
    cost = TableStepCost(tokens=(1, 1024), forward_s=(1e-6, 1e-5))  # a GPU far ahead of its host
    table = HostBound(cost, replace(lay.host, step_s=0.0, seq_step_s=0.0), layers=m.num_layers,
                      graphs=lay.graphs, layer=mine)
    within = StepBatch(prefill_tokens=32, sampled=1)
    assert table.launch_s(within) == pytest.approx(table.step_s(within))


def test_no_planner_signature_holds_a_graph_range_of_its_own() -> None:
    # the range comes from the layout's graphs (Policy.cuda_graphs, resolved on its GPUs) or
    # cudagraphs' one named default, never from a number written beside a parameter (the agent
    # plan's three `graph_steps: int = 512` went their own way from Policy.graph_steps)
    import importlib
    import inspect
    import pkgutil

    import launcher.planner

    found = []
    for info in pkgutil.iter_modules(launcher.planner.__path__):
        mod = importlib.import_module(f"launcher.planner.{info.name}")
        owned = [o for _, o in inspect.getmembers(mod)
                 if getattr(o, "__module__", "") == mod.__name__]
        funcs = [o for o in owned if inspect.isfunction(o)]
        funcs += [f for c in owned if inspect.isclass(c)
                  for _, f in inspect.getmembers(c, inspect.isfunction)]
        for f in funcs:
            for p in inspect.signature(f).parameters.values():
                if "graph" in p.name and isinstance(p.default, int) and p.default > 0:
                    found.append(f"{mod.__name__}.{f.__qualname__}({p.name}={p.default})")
    assert not found
