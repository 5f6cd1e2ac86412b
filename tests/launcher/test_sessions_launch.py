"""The agent plan's sessions and the kernel-table path begin a burst as the load simulation does
(tests/launcher/test_schedsim_launch.py): the front end hands requests over one at a time, the
engine core launches an eager step before it takes the step before's output, and a kernel
table's timer says how long that launch takes by the same rule as the roofline's."""

from __future__ import annotations

import pytest

from launcher.model.modelspec import load_model_spec
from launcher.planner import agent as agent_mod
from launcher.planner import costmodel, hardware, loadsim
from launcher.planner.cudagraphs import Requested
from launcher.planner.hardware import SERVER_HOST
from launcher.planner.kernelcost import HostBound
from launcher.planner.schedsim import (
    LaunchTimer,
    SchedulerLimits,
    StepBatch,
    TableStepCost,
    Turn,
    Workload,
    simulate,
    simulate_sessions,
)
from tests.launcher.paths import MODELS, model
from tests.launcher.test_agent_plan import PAIR, agent

# the same stand-in timers and limits as the load simulation's launch tests
from tests.launcher.test_schedsim_launch import (
    ASYNC,
    DECODE_S,
    PREFILL_S,
    SYNC,
    Launching,
    Steps,
)


def sessions_burst(lim: SchedulerLimits, timer: Steps, serial_s: float) -> list[float]:
    """Two sessions sending a 16-token turn at once: first token and end of each, in order."""
    res = simulate_sessions(lim, timer, (Turn(16, 3),), 2,
                            serial_s_per_prompt_token=serial_s / 16)
    return [t for r in res.turns[0] for t in (r.first_token_s, r.finished_s)]


def burst(lim: SchedulerLimits, timer: Steps, serial_s: float) -> list[float]:
    res = simulate(lim, timer, Workload(16, 3, arrivals=(0.0, 0.0)), request_serial_s=serial_s)
    return [t for r in sorted(res.requests, key=lambda r: r.finished_s)
            for t in (r.first_token_s, r.finished_s)]


def test_sessions_sent_together_reach_an_idle_engine_one_at_a_time() -> None:
    # handed over 50 ms apart: the first prompt runs alone (0-0.1 s), the second in the next
    # step with the first's decode (0.1-0.2 s), then one decode each (0.2-0.21, 0.21-0.22 s)
    assert sessions_burst(SYNC, Steps(), 0.05) == pytest.approx(
        [0.1, 0.21, 0.2, 0.22])
    assert sessions_burst(SYNC, Steps(), 0.0) == pytest.approx([0.1, 0.12, 0.1, 0.12])


def test_sessions_hand_a_steps_output_over_once_the_next_is_launched_as_a_burst_does() -> None:
    # step 1 (A alone) launched in 0.1 s, so step 2 is chosen at 0.1 s and holds B's prompt;
    # A's first token goes out once step 2 is launched (0.2 s), B's as step 3 (a graph replay)
    # starts (0.2 s)
    assert isinstance(Launching(PREFILL_S), LaunchTimer)
    expected = [0.2, 0.21, 0.2, 0.22]
    assert sessions_burst(ASYNC, Launching(PREFILL_S), 0.05) == pytest.approx(expected)
    assert burst(ASYNC, Launching(PREFILL_S), 0.05) == pytest.approx(expected)


def test_a_tables_eager_step_is_launched_as_the_rooflines_and_a_graph_replay_at_once() -> None:
    cost = TableStepCost(tokens=(1, 1024), forward_s=(0.001, 0.01), max_graph_tokens=512)
    timer = HostBound(cost, SERVER_HOST, layers=40)
    assert isinstance(timer, LaunchTimer)
    eager = StepBatch(prefill_tokens=600, sampled=1)
    own = hardware.STEP_OVERHEAD_S  # the engine core's own work a step, every launch
    assert timer.launch_s(eager) == pytest.approx(own + 40 * SERVER_HOST.layer_launch_s)
    # past the CUDA-graph range decoders alone run eagerly too (vLLM captures no larger graph)
    assert timer.launch_s(StepBatch(decode_seqs=600, decode_context=60_000, sampled=600)) \
        == pytest.approx(own + 40 * SERVER_HOST.layer_launch_s)
    # within it a decode step replays one full graph at once; a step with prompt chunks
    # replays piecewise graphs, the attention between them launched from Python
    assert timer.launch_s(StepBatch(decode_seqs=60, decode_context=6_000, sampled=60)) == \
        pytest.approx(own)
    assert timer.launch_s(StepBatch(prefill_tokens=500, decode_seqs=12, sampled=13)) \
        == pytest.approx(own + 40 * SERVER_HOST.piecewise_layer_s)


def test_every_path_builds_its_timer_with_the_models_launch() -> None:
    """The table's timer as layout_step and the agent plan build it, and the agent plan's
    roofline step, launch an eager step of the model's layers at the host's pace."""
    from launcher.planner.kernelcost import layout_step
    from launcher.planner.layouts import Links, candidate_layout
    from launcher.planner.plan import plan
    from launcher.planner.plantypes import Policy
    from launcher.probe.topology import load_topology
    from tests.launcher.test_kernels import step_shape, table_like

    topo = load_topology(str(MODELS.parents[0] / "topologies" / "h200x2-nvlink.nvml.json"), {})
    m = load_model_spec(str(MODELS / "deepseek-v2-lite"))
    table = table_like(step_shape(m, 1), topo.gpus[0].name, 0.001)
    c = next(c for c in plan(topo, m, Policy(force_tp=1, force_dp=1, kernels=(table,)))
             .candidates if c.kernel_table is not None)
    assert c.fit is not None
    lay = candidate_layout(c, topo, Links(topo, Requested(64)), c.fit.kv_budget)
    eager = StepBatch(prefill_tokens=512, sampled=1)
    # DeepSeek's layer, family extras and all (costmodel.layer_host), as its steps' own floor
    layer = costmodel.layer_host(m, lay.host)
    assert layer.eager_s > lay.host.layer_launch_s
    own = hardware.STEP_OVERHEAD_S  # the engine core's own work a step, every launch
    want = own + m.num_layers * layer.eager_s
    timers = (layout_step(m, table, lay), layout_step(m, table, lay, max_graph_tokens=64),
              agent_mod.step_timer(m, lay, (table,)),
              agent_mod.RooflineStep(m, lay), loadsim.RooflineStep(m, lay))
    for timer in timers:
        assert isinstance(timer, LaunchTimer)
        assert timer.launch_s(eager) == pytest.approx(want)
    # every path launches under the layout's graphs (lay.graphs, to 64 tokens): a prompt step
    # within them replays the pieces, a step of decoders past them runs eagerly
    within = StepBatch(prefill_tokens=32, sampled=1)
    decoders = StepBatch(decode_seqs=100, decode_context=100 * 600, sampled=100)
    for timer in timers:
        assert isinstance(timer, LaunchTimer)
        assert timer.launch_s(within) == pytest.approx(own + m.num_layers * layer.piecewise_s)
        assert timer.launch_s(decoders) == pytest.approx(want)
    # within the range: the piecewise graphs' host work, not the eager layers'
    assert layout_step(m, table, lay, max_graph_tokens=512).launch_s(eager) == pytest.approx(  # type: ignore[attr-defined]
        own + m.num_layers * layer.piecewise_s)


def test_the_agent_plans_sessions_reach_the_engine_at_the_front_ends_pace() -> None:
    # two sessions' 512-token turns sent together: the API server's loop shares its work on
    # them (the host's request_s + 512 x prompt_token_s) between them but for its last stage,
    # the hand-over (hardware.API_LOOP_HANDOFF_SHARE), so the first is handed over one shared
    # part later than alone (schedsim._FrontEnd) and the second its hand-over after that, so
    # the first prompt runs alone. The GPU engine
    # schedules asynchronously (schedsim.vllm_async_scheduling): the step after it was chosen
    # as it started, before the second came, and only decodes the first; the second's prompt
    # runs in the step after that
    m = load_model_spec(model("llama-3.1-8b"))
    room = agent(PAIR, "llama-3.1-8b", 2, 8000)[1].room
    assert room.lay is not None
    host = room.lay.host
    res = agent_mod.simulate_turns(m, room, (Turn(512, 4),), 2, think_s=None, offload=False,
                                   timer=Steps())
    loop = host.request_s + 512 * host.prompt_token_s
    way_in = (host.request_fixed_s + 512 * host.prompt_token_s
              + (1 - hardware.API_LOOP_HANDOFF_SHARE) * loop)
    assert [r.ttft_s for r in res.turns[0]] == pytest.approx(
        [way_in + PREFILL_S, way_in + PREFILL_S + DECODE_S + PREFILL_S])
