"""The KV cache of Llama 4's chunked-attention layers under vLLM's hybrid KV-cache manager, and
without it. With VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 (vLLM's default) each
chunked layer keeps one chunk's blocks, as memfit sizes them; with 0 vLLM turns the manager off
and promotes every local layer to full-attention blocks (kv_cache_utils
unify_hybrid_kv_cache_specs), the whole context in all 48 of Scout's layers. A plan pins the
variable to the cache its context was sized with (memfit.hybrid_kv_pin). Checked against vLLM
0.32's own reading of the variable and its own KV-cache sizing, run on the CPU."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest

from launcher.model.modelspec import GIB, KvGroup, ModelSpec, load_model_spec
from launcher.planner import memfit
from launcher.planner.memfit import (
    HYBRID_KV_ENV,
    hybrid_kv_allowed,
    kv_as_cached,
    local_kv_promoted,
)
from launcher.planner.plan import Policy, plan
from launcher.probe.topology import load_topology
from tests.launcher.paths import REPO, model, topo

SCOUT = REPO / "tests" / "fixtures" / "recent-models" / "llama-4-scout-17b-16e-instruct"
BATCHED = 8192


@cache
def scout() -> ModelSpec:
    return load_model_spec(str(SCOUT))


def tiny_llama4() -> ModelSpec:
    """Llama 4's layer pattern at 4 layers: one full-attention layer, three chunked ones."""
    return replace(scout(), num_layers=4, layer_kv=(KvGroup(1, 8, 128),
                                                    KvGroup(3, 8, 128, 8192, chunked=True)))


def test_a_chunked_attention_models_layers_hold_the_whole_context_unless_vllms_hybrid_cache_is_allowed(  # noqa: E501
) -> None:
    m = tiny_llama4()
    off = kv_as_cached(m, {HYBRID_KV_ENV: "0"})
    assert [(g.layers, g.window, g.chunked) for g in off.kv_groups] == [(4, None, False)]
    # allowed, or left to vLLM's default: the chunked layers keep one chunk each
    assert kv_as_cached(m, {HYBRID_KV_ENV: "1"}) is m
    assert kv_as_cached(m, {}) is m
    # 100,000 tokens: one full layer's 100,000 and three of a chunk's 8,192 + 2 x 8,192 in
    # flight, against four layers of 100,000
    on_bytes = memfit.request_kv_bytes(m, 100_000, BATCHED)
    off_bytes = memfit.request_kv_bytes(off, 100_000, BATCHED)
    token = 2 * 8 * 128 * 2
    assert on_bytes == (6250 + 3 * 1536) * 16 * token
    assert off_bytes == 4 * 6250 * 16 * token


def test_the_variable_is_read_as_vllm_reads_it() -> None:
    pytest.importorskip("vllm")
    import os

    from vllm import envs

    for value in (None, "1", "0", "2"):
        env = {} if value is None else {HYBRID_KV_ENV: value}
        saved = os.environ.pop(HYBRID_KV_ENV, None)
        try:
            os.environ.update(env)
            theirs = envs.environment_variables[HYBRID_KV_ENV]()
        finally:
            os.environ.pop(HYBRID_KV_ENV, None)
            if saved is not None:
                os.environ[HYBRID_KV_ENV] = saved
        assert hybrid_kv_allowed(env) is theirs, value


def test_a_model_with_no_chunked_layer_is_sized_alike_whatever_the_variable() -> None:
    gemma = load_model_spec(model("gemma-3-27b"))  # sliding + full: not the variable's
    assert kv_as_cached(gemma, {HYBRID_KV_ENV: "0"}) is gemma
    dense = load_model_spec(model("llama-3.1-8b"))
    assert local_kv_promoted(dense) is dense
    # every layer local: vLLM's specs are uniform already and nothing is promoted
    all_local = replace(tiny_llama4(), layer_kv=(KvGroup(4, 8, 128, 8192, chunked=True),))
    assert local_kv_promoted(all_local) is all_local


@pytest.mark.parametrize("gib", [1.0, 16.0, 64.0])
def test_vllms_own_sizing_agrees_with_and_without_its_hybrid_cache(gib: float) -> None:
    pytest.importorskip("vllm")
    from tests.launcher.vllm_kv_truth import Engine, read_config, vllm_accepts

    t, m = read_config(SCOUT), scout()
    budget = int(gib * GIB)
    on = vllm_accepts(t, budget, Engine(batched_tokens=BATCHED))
    off = vllm_accepts(t, budget, Engine(batched_tokens=BATCHED, hybrid_kv=False))
    assert on - 16 <= memfit.longest_context(m, budget, BATCHED) <= on
    promoted = local_kv_promoted(m)
    assert off - 16 <= memfit.longest_context(promoted, budget, BATCHED) <= off
    if gib < 16:  # 1 GiB: 5,456 tokens, inside the chunk and the in-flight tokens: alike
        assert on - 16 <= off <= on
    else:  # 16 GiB: 275,776 against 87,360; 64 GiB: 1,324,352 against 349,504
        assert on > 3 * off


def test_a_plan_of_scout_pins_the_hybrid_cache_its_context_was_sized_with() -> None:
    topology = load_topology(topo("4xh200-nvswitch"), {})
    p = plan(topology, scout(), Policy())
    assert p.env[HYBRID_KV_ENV] == "1"
    line = next(r for r in p.reasons if r.startswith(f"{HYBRID_KV_ENV}=1"))
    assert "36 chunked-attention layers" in line
    # the context is one vLLM with the manager on accepts, far past what promotion would hold
    m = memfit.tp_share(scout(), p.tp)
    on = memfit.request_kv_bytes(m, p.max_model_len, BATCHED)
    assert memfit.request_kv_bytes(local_kv_promoted(m), p.max_model_len, BATCHED) > 3 * on


def test_a_plan_of_a_model_without_chunked_layers_sets_no_such_variable() -> None:
    topology = load_topology(topo("4xh200-nvswitch"), {})
    p = plan(topology, load_model_spec(model("llama-3.1-8b")), Policy())
    assert HYBRID_KV_ENV not in p.env
    assert not any(HYBRID_KV_ENV in r for r in p.reasons)
