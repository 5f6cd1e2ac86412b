"""Whether a simulated engine schedules asynchronously is one rule
(:func:`asyncsched.vllm_async_scheduling`), from vLLM's defaults: on for a GPU engine without
pipeline stages from vLLM 0.14 (vllm-project/vllm#27614), off on the CPU engine
(vllm/platforms/cpu.py) and with pipeline stages. The agent plan's sessions, the load
simulation's load and a kernel table's prediction all run by it."""

from __future__ import annotations

from typing import Any

import pytest

from launcher.model.modelspec import load_model_spec
from launcher.planner import agent as agent_mod
from launcher.planner import kernelcost, loadsim
from launcher.planner.agent import Room, simulate_turns
from launcher.planner.asyncsched import vllm_async_scheduling
from launcher.planner.hardware import SERVER_HOST
from launcher.planner.schedsim import SchedulerLimits, Turn
from tests.launcher.paths import model
from tests.launcher.test_agent_plan import PAIR, agent
from tests.launcher.test_kernels import synthetic_table
from tests.launcher.test_schedsim_launch import Steps


@pytest.mark.parametrize(("version", "on"), [("0.10.2", False), ("0.13.0", False),
                                             ("0.14.0rc1", True), ("0.14.0", True),
                                             ("0.26.0", True), ("1.0.0", True), (None, True)])
def test_a_gpu_engine_schedules_asynchronously_from_vllm_0_14(version: str | None,
                                                               on: bool) -> None:
    assert vllm_async_scheduling(gpu=True, vllm_version=version) is on


@pytest.mark.parametrize("version", ["0.26.0", "0.32.0+cpu", None])
def test_the_cpu_engine_and_pipeline_stages_never_do(version: str | None) -> None:
    assert not vllm_async_scheduling(gpu=False, vllm_version=version)
    assert not vllm_async_scheduling(gpu=True, pp=2, vllm_version=version)


def limits_simulated(monkeypatch: pytest.MonkeyPatch, room: Room) -> SchedulerLimits:
    """The scheduler limits the agent plan's simulation of ``room`` runs under."""
    seen: list[SchedulerLimits] = []
    real = agent_mod.simulate_sessions

    def spy(lim: SchedulerLimits, *args: Any, **kw: Any) -> Any:
        seen.append(lim)
        return real(lim, *args, **kw)

    monkeypatch.setattr(agent_mod, "simulate_sessions", spy)
    m = load_model_spec(model("llama-3.1-8b"))
    simulate_turns(m, room, (Turn(512, 4),), 2, think_s=None, offload=False, timer=Steps())
    (lim,) = seen
    return lim


def test_the_agent_plans_gpu_sessions_schedule_as_the_load_simulation_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    chosen, ap = agent(PAIR, "llama-3.1-8b", 2, 8000)
    room = ap.room
    assert room.lay is not None
    assert room.pp == 1
    c = chosen.candidates[0]
    assert c.fit is not None
    load = loadsim.scheduler_limits(load_model_spec(model("llama-3.1-8b")), c.fit, 8, 1000,
                                    pp=room.pp)
    lim = limits_simulated(monkeypatch, room)
    assert lim.async_scheduling is load.async_scheduling is True
    assert lim.async_scheduling is vllm_async_scheduling(gpu=True, pp=room.pp)


def test_the_agent_plans_cpu_sessions_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    room = agent(PAIR, "llama-3.1-8b", 2, 8000)[1].room
    cpu = Room("", 1, 1, 1, "auto", 0, 2, room.kv_budget_bytes, 0.0, 0.0, 0.0)  # lay None
    assert not limits_simulated(monkeypatch, cpu).async_scheduling


@pytest.mark.parametrize("pp", [1, 2])
def test_the_load_simulations_replica_schedules_by_the_one_rule(pp: int) -> None:
    # a replica with pipeline stages (loadgen_run runs one where asked) schedules without
    c = agent(PAIR, "llama-3.1-8b", 2, 8000)[0].candidates[0]
    assert c.fit is not None
    lim = loadsim.scheduler_limits(load_model_spec(model("llama-3.1-8b")), c.fit, 8, 1000, pp=pp)
    assert lim.async_scheduling is vllm_async_scheduling(gpu=True, pp=pp) is (pp == 1)


@pytest.mark.parametrize(("gpu", "pp"), [(True, 1), (True, 2), (False, 1)])
def test_a_kernel_tables_prediction_schedules_by_the_one_rule(
        monkeypatch: pytest.MonkeyPatch, gpu: bool, pp: int) -> None:
    seen: list[SchedulerLimits] = []
    real = kernelcost.predict

    def spy(cost: Any, lim: SchedulerLimits, **kw: Any) -> Any:
        seen.append(lim)
        return real(cost, lim, **kw)

    monkeypatch.setattr(kernelcost, "predict", spy)
    kernelcost.as_prediction(
        load_model_spec(model("llama-3.1-8b")), synthetic_table(), kv_bytes=2**30, block=16,
        batched_tokens=8192, max_num_seqs=256, prompt=100, gen=11, concurrency=2,
        assumed_step_overhead_s=1e-3, request_overhead_s=3e-3,
        host=SERVER_HOST if gpu else None, pp=pp)
    (lim,) = seen
    assert lim.async_scheduling is vllm_async_scheduling(gpu=gpu, pp=pp)
