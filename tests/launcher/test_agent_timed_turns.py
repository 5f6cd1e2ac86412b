"""The agent plan's turn alone at depth (each room's cached and recomputed TTFT, the figures
issue 22's depth rows check) is timed on this model's kernel table where one is kept for the
layout, through the simulated scheduler as every option's figure is, and on the roofline only
where none is (agent.timed_turn_ttft_s). The thirteenth H200 table's Qwen3-8B planned its
32k-token cold turn on the roofline at the H200's datasheet rates: 1.381 s, measured 1.241 s,
where its kernel table's steps give 1.206 s."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.model.modelspec import load_model_spec
from launcher.pipeline.run import plan_with_agent
from launcher.planner import agent
from launcher.planner.kernelcost import step_shape
from launcher.planner.plantypes import Policy
from launcher.planner.schedsim import Turn
from launcher.probe.topology import load_topology
from tests.launcher.test_kernels import table_like
from tests.support.table13 import REPO, table13_case

MODELS = REPO / "tests" / "fixtures" / "models"
TOPOS = REPO / "tests" / "fixtures" / "topologies"


def rooms(policy: Policy, ask: agent.AgentAsk, model: str = "llama-3.1-8b",
          topo: str = "h200x2-nvlink.nvml.json") -> tuple[agent.Room, ...]:
    m = load_model_spec(str(MODELS / model))
    _, ap = plan_with_agent(load_topology(str(TOPOS / topo), {}), m, policy, ask, None)
    assert ap is not None
    return ap.rooms


def test_a_kept_table_times_the_turn_alone_through_the_simulated_scheduler() -> None:
    m = load_model_spec(str(MODELS / "llama-3.1-8b"))
    topo = load_topology(str(TOPOS / "h200x2-nvlink.nvml.json"), {})
    table = table_like(step_shape(m, 1), topo.gpus[0].name, 0.1)
    ask = agent.AgentAsk(1, 8000, 512, 64)
    policy = Policy(force_tp=1, force_dp=1, kernels=(table,))
    every = rooms(policy, ask)
    timed = [r for r in every if r.pp == 1]  # the table's layout, one GPU
    assert timed
    assert not any(r.timed for r in every if r.pp > 1)  # a layout the table was not timed for
    for r in timed:
        assert r.timed
        assert r.lay is not None
        alone = agent.simulate_turns(m, r, (Turn(8512, 64),), 1, think_s=None, offload=False,
                                     timer=agent.step_timer(m, r.lay, (table,)))
        assert r.ttft_cold_s == pytest.approx(alone.ttft(0).p50)
        assert r.ttft_warm_s < r.ttft_cold_s
    assert len({(r.ttft_warm_s, r.ttft_cold_s) for r in timed}) == 1  # 16-bit and FP8 alike
    roof = [r for r in rooms(Policy(force_tp=1, force_dp=1), ask) if r.pp == 1]
    assert not any(r.timed for r in roof)
    assert [(r.ttft_warm_s, r.ttft_cold_s) for r in roof] == [
        agent.turn_ttft_s(m, r.lay, 8000, 512, r.batched_tokens) for r in roof if r.lay]
    assert roof[0].ttft_cold_s != pytest.approx(timed[0].ttft_cold_s, rel=1e-3)


def test_a_slower_table_makes_a_slower_turn() -> None:
    m = load_model_spec(str(MODELS / "llama-3.1-8b"))
    name = load_topology(str(TOPOS / "h200x2-nvlink.nvml.json"), {}).gpus[0].name
    ask = agent.AgentAsk(1, 16000, 512, 64)
    fast, slow = (next(r for r in rooms(Policy(force_tp=1, force_dp=1, kernels=(
        table_like(step_shape(m, 1), name, s),)), ask) if r.timed) for s in (0.05, 0.2))
    assert slow.ttft_cold_s > fast.ttft_cold_s
    assert slow.ttft_warm_s > fast.ttft_warm_s


def test_a_layout_without_its_table_keeps_the_roofline() -> None:
    # the table is timed at TP 1: the TP-2 layout's turn stays the roofline's
    m = load_model_spec(str(MODELS / "llama-3.1-8b"))
    name = load_topology(str(TOPOS / "h200x2-nvlink.nvml.json"), {}).gpus[0].name
    got = rooms(Policy(force_tp=2, force_dp=1,
                       kernels=(table_like(step_shape(m, 1), name, 0.1),)),
                agent.AgentAsk(1, 8000, 512, 64))
    assert got
    assert not any(r.timed for r in got)


def test_the_thirteenth_tables_qwen3_8b_turns_from_its_kernel_table(tmp_path: Path) -> None:
    """The H200's Qwen3-8B (session 25, loadgen --depth p50s below): the turns alone its own
    kernel table gives, on the topology and host the machine's plan read (NVML alone, its
    host record), within 5%; the roofline at the datasheet's rates there (the machine's plan)
    was +3/+11% cached and +4/+11% recomputed at 8k/32k."""
    m, table, topo = table13_case(tmp_path, "qwen3-8b-shape", "qwen8b")
    measured = {8000: (0.0252, 0.2266), 32000: (0.0489, 1.241)}
    for depth, (warm, cold) in measured.items():
        policy = Policy(force_tp=1, force_dp=1, gpu_memory_utilization=0.3, kernels=(table,))
        _, ap = plan_with_agent(topo, m, policy, agent.AgentAsk(1, depth, 512, 64), None)
        assert ap is not None
        r = ap.rooms[0]
        assert r.timed
        assert r.ttft_warm_s == pytest.approx(warm, rel=0.05)
        assert r.ttft_cold_s == pytest.approx(cold, rel=0.05)
