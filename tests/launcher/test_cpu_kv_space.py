"""The CPU engine's KV cache (VLLM_CPU_KVCACHE_SPACE) is chosen from what the model needs and
what the host has, so that no plan asks vLLM for a context of 0 or one its cache cannot hold;
and a GPU plan of a model whose state per sequence outgrows the KV budget is refused, never
planned at 0 tokens."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.engine.render import EngineOptions, engine_command
from launcher.errors import PlanError
from launcher.model.modelspec import GIB, ModelSpec, load_model_spec
from launcher.planner import memfit
from launcher.planner.plan import MIN_CONTEXT, Plan, Policy, cpu_wanted_context, plan
from launcher.planner.plantypes import CPU_KV_CACHE_GIB, CPU_KV_ENV, cpu_kv_cache_gib
from launcher.probe.topology import Topology, load_topology
from tests.launcher.paths import MODELS, REPO, topo

NEMOTRON_H = load_model_spec(str(REPO / "tests" / "fixtures" / "recent-models"
                                 / "nemotron-h-56b-base-8k"))
LLAMA_8B = load_model_spec(str(MODELS / "llama-3.1-8b"))


def _cpu(host_gib: float | None) -> Topology:
    return Topology(gpus=(), host_available_bytes=None if host_gib is None
                    else int(host_gib * GIB))


def _space(p: Plan) -> int:
    return int(p.env[CPU_KV_ENV])


def _plan_or_refusal(topology: Topology, m: ModelSpec, policy: Policy) -> Plan | str:
    try:
        return plan(topology, m, policy)
    except PlanError as exc:
        return str(exc)


def test_a_model_whose_state_per_sequence_exceeds_the_default_cpu_kv_space_gets_a_larger_space_where_the_host_has_it() -> None:  # noqa: E501
    # Nemotron-H's recurrent state and first attention blocks outgrow 1 GiB before one token
    assert memfit.cpu_context(NEMOTRON_H, CPU_KV_CACHE_GIB * GIB) == 0
    p = plan(_cpu(256), NEMOTRON_H, Policy())
    assert _space(p) > CPU_KV_CACHE_GIB
    assert p.max_model_len >= MIN_CONTEXT
    assert p.max_model_len == memfit.cpu_context(NEMOTRON_H, _space(p) * GIB)
    assert any(f"{CPU_KV_ENV}={_space(p)}" in r for r in p.reasons)
    # and the engine is given that cache, not the default
    cmd = engine_command(p, "m", EngineOptions(), {})
    assert cmd.env[CPU_KV_ENV] == str(_space(p))


def test_a_model_the_default_cpu_kv_space_holds_keeps_it() -> None:
    p = plan(_cpu(64), LLAMA_8B, Policy())
    assert _space(p) == CPU_KV_CACHE_GIB
    assert p.max_model_len == memfit.cpu_context(LLAMA_8B, CPU_KV_CACHE_GIB * GIB) >= MIN_CONTEXT
    assert not any("raised" in r for r in p.reasons)


def test_a_host_too_small_for_the_weights_and_the_cache_is_refused_in_one_line() -> None:
    weights = memfit.held_weight_bytes(NEMOTRON_H) / GIB
    with pytest.raises(PlanError) as err:
        plan(_cpu(weights + 1), NEMOTRON_H, Policy())
    said = str(err.value)
    assert "\n" not in said
    assert "GiB of host memory" in said
    assert f"{weights + 1:.1f} GiB is free" in said
    assert "smaller or quantized model" in said
    assert "RAM" in said
    assert "GPU" in said


def test_a_users_cpu_kv_space_that_holds_no_useful_context_is_refused_with_the_size_that_would() -> None:  # noqa: E501
    with pytest.raises(PlanError) as err:
        plan(_cpu(None), NEMOTRON_H, Policy(cpu_kv_cache_gib=1))
    said = str(err.value)
    assert "\n" not in said
    assert said.startswith("VLLM_CPU_KVCACHE_SPACE=1 holds 0 tokens")
    wanted = cpu_wanted_context(NEMOTRON_H, Policy())
    sized = -(-memfit.cpu_kv_holding(NEMOTRON_H, wanted) // GIB)
    assert f"set it to {sized:g}" in said


def test_a_users_cpu_kv_space_is_planned_and_left_to_the_users_environment() -> None:
    p = plan(_cpu(None), NEMOTRON_H, Policy(cpu_kv_cache_gib=6))
    assert _space(p) == 6
    assert p.max_model_len == memfit.cpu_context(NEMOTRON_H, 6 * GIB)
    # the user's own variable reaches vLLM as set; render adds none beside it
    assert CPU_KV_ENV not in engine_command(p, "m", EngineOptions(), {CPU_KV_ENV: "6"}).env


def test_a_cpu_plan_saved_before_it_carried_its_cache_is_served_with_the_default() -> None:
    p = replace(plan(_cpu(64), LLAMA_8B, Policy()), env={})
    assert cpu_kv_cache_gib(p) == CPU_KV_CACHE_GIB
    assert engine_command(p, "m", EngineOptions(), {}).env[CPU_KV_ENV] == "1"


def test_an_asked_length_longer_than_the_cache_holds_passes_through_as_asked() -> None:
    # vLLM's own check refuses it and `launcher serve` starts again at the length it names
    # (test_kvrefusal_cpu): the cache is sized for a useful context, not for the asked length
    p = plan(_cpu(None), LLAMA_8B, Policy(max_model_len=131072))
    assert p.max_model_len == 131072
    assert _space(p) == CPU_KV_CACHE_GIB


@given(state_mib=st.integers(0, 8192), host_gib=st.one_of(st.none(), st.floats(1, 400)),
       positions=st.integers(1, 1 << 20), prompt=st.integers(1, 32768),
       gen=st.integers(1, 4096), asked=st.one_of(st.none(), st.integers(1, 1 << 20)))
def test_generated_cpu_hosts_and_states_never_plan_a_context_of_0(
        state_mib: int, host_gib: float | None, positions: int, prompt: int, gen: int,
        asked: int | None) -> None:
    m = replace(NEMOTRON_H, recurrent_state_bytes=state_mib << 20,
                max_position_embeddings=positions)
    policy = Policy(prompt_tokens=prompt, gen_tokens=gen,
                    max_model_len=None if asked is None else min(asked, positions))
    p = _plan_or_refusal(_cpu(host_gib), m, policy)
    if isinstance(p, str):
        assert "\n" not in p
        assert "GiB of host memory" in p
        assert host_gib is not None  # refused only for the host's memory
        return
    wanted = cpu_wanted_context(m, policy)
    assert p.max_model_len >= wanted >= 1
    assert _space(p) * GIB >= memfit.cpu_kv_holding(m, wanted)
    assert memfit.cpu_context(m, _space(p) * GIB) >= wanted
    if host_gib is not None:
        assert memfit.held_weight_bytes(m) + _space(p) * GIB <= host_gib * GIB


@pytest.mark.parametrize("name", ["2x3090-p2p-x16", "h200x2-nvlink"])
@given(state_mib=st.integers(0, 512 * 1024))
def test_generated_gpu_states_are_refused_or_planned_a_whole_context(
        name: str, state_mib: int) -> None:
    # a recurrent state per sequence from none to beyond two H200s' KV budget
    m = replace(NEMOTRON_H, recurrent_state_bytes=state_mib << 20)
    topology = load_topology(topo(name), {})
    p = _plan_or_refusal(topology, m, Policy())
    if isinstance(p, str):
        assert "does not fit" in p
        return
    assert p.max_model_len >= min(MIN_CONTEXT, m.max_position_embeddings)
    assert all(c.max_model_len is None or c.max_model_len >= 1 for c in p.candidates)


def _hybrid_fit(m: ModelSpec, gib: float) -> memfit.Fit:
    topology = load_topology(topo("h200x2-nvlink"), {})
    gpu = replace(topology.gpus[0], memory_bytes=int(gib * GIB))
    return memfit.fit(m, [gpu], 1, 1, 0.9)


@given(state_mib=st.integers(0, 64 * 1024), card_gib=st.floats(8, 200),
       wanted=st.integers(1, 8192))
def test_a_gpu_fit_whose_need_for_a_length_is_within_its_budget_plans_at_least_that_length(
        state_mib: int, card_gib: float, wanted: int) -> None:
    # the layouts' check (need_per_gpu against the budget) and the planned context agree: a
    # layout the check admits never plans 0 or fewer tokens than it was checked for
    m = replace(NEMOTRON_H, recurrent_state_bytes=state_mib << 20)
    f = _hybrid_fit(m, card_gib)
    if memfit.need_per_gpu(f, m, 1, 1, wanted) <= f.budget:
        assert f.context >= wanted
