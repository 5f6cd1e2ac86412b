"""One memory model: the sequences the cost model batches are the ones memfit's KV pool holds
(vLLM's blocks, sliding windows and padded layer groups), not a division of its own."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from launcher.model.modelspec import GIB, load_model_spec
from launcher.planner import memfit
from launcher.planner.plan import plan
from launcher.planner.plantypes import Policy
from launcher.probe.topology import load_topology
from tests.launcher.paths import model, topo

MODELS = ("llama-3.3-70b", "gemma-3-27b", "gemma-4-31b", "qwen3-30b-a3b", "deepseek-v2-lite")


def test_the_cost_models_batch_is_what_the_kv_pool_holds() -> None:
    # Gemma 3 27B over three 24 GB cards: the KV cache, not the 32 streams, limits the batch
    m = load_model_spec(model("gemma-3-27b"))
    p = plan(load_topology(topo("3x3090-one-x4"), {}), m, Policy(workload="throughput"))
    chosen = next(c for c in p.candidates if c.gpus == p.gpus and c.mode == p.mode)
    assert chosen.fit is not None
    held = memfit.sequences_held(m, chosen.fit, 512 + 256)
    assert 1 < held < 32
    assert p.predicted.batch == held
    # a sliding layer holds its window and the batches in flight, padded as vLLM groups them:
    # fewer sequences than the bytes of 768 tokens per sequence would suggest
    assert held < chosen.fit.kv_budget // m.kv_bytes(768)


@given(tokens=st.integers(1, 200_000), budget_gib=st.floats(0.5, 400))
def test_longer_requests_never_fit_more_at_once(tokens: int, budget_gib: float) -> None:
    for name in MODELS:
        m = load_model_spec(model(name))
        blocks = memfit.pool_blocks(m, budget_gib * GIB)
        short = memfit.request_blocks(m, tokens, 8192)
        longer = memfit.request_blocks(m, tokens + 1000, 8192)
        assert short <= longer
        assert blocks // max(1, short) >= blocks // max(1, longer)


@given(tokens=st.integers(1, 131_072), budget_gib=st.floats(0.5, 400))
def test_the_sequences_held_fit_the_kv_memory_as_vllm_checks_it(
        tokens: int, budget_gib: float) -> None:
    """As many requests as the pool is said to hold need, by vLLM's start-up arithmetic for one
    request (request_kv_bytes), no more than the KV memory."""
    for name in MODELS:
        m = load_model_spec(model(name))
        budget = budget_gib * GIB
        per = memfit.request_blocks(m, tokens, 8192)
        held = memfit.pool_blocks(m, budget) // per
        assert held * memfit.request_kv_bytes(m, tokens, 8192) <= budget
