"""The memory fit of hybrid attention + Mamba / linear-attention models against vLLM's own rule.

vLLM raises a hybrid model's attention block until one attention page (one layer) holds a
recurrent layer's state page, pads the state page to it, and its start-up check counts each
recurrent group's pages per request whatever the length, after keeping one pool block back for
its null block. The reference is vLLM's engine core's own ``get_kv_cache_configs`` run on the
CPU over the specs vLLM builds from the fixtures' real configs
(tests/launcher/vllm_kv_truth.py)."""

from __future__ import annotations

import pytest

from launcher.model.modelspec import ALIGN_STATE_PAGES, GIB, ModelSpec, load_model_spec
from launcher.planner import memfit
from tests.launcher.paths import REPO
from tests.launcher.vllm_kv_truth import Engine, read_config, vllm_accepts, vllm_specs

RECENT = REPO / "tests" / "fixtures" / "recent-models"
QWEN3_NEXT = "qwen3-next-80b-a3b-thinking"
NEMOTRON_H = "nemotron-h-56b-base-8k"
BATCHED = 8192


def _spec(name: str) -> ModelSpec:
    return load_model_spec(str(RECENT / name))


def _accepted(name: str, budget: float, tp: int = 1) -> int:
    """The context vLLM's engine core settles on for ``budget`` bytes of KV on each GPU."""
    engine = Engine(tp=tp, batched_tokens=BATCHED)
    return vllm_accepts(read_config(RECENT / name), int(budget), engine)


@pytest.mark.parametrize("budget_gib", [1.5, 4.0])
def test_qwen3_next_gets_exactly_the_context_vllms_engine_accepts(budget_gib: float) -> None:
    # 12 attention layers and 36 linear-attention ones: groups of 12 need no padding, and
    # vLLM keeps one pool block (12 pages) back for its null block before it checks
    m = _spec(QWEN3_NEXT)
    budget = budget_gib * GIB
    accepted = _accepted(QWEN3_NEXT, budget)
    assert 0 < accepted < m.max_position_embeddings
    assert memfit.longest_context(m, budget, BATCHED) == accepted
    cushion = memfit.context_cushion(
        memfit.overhead_per_gpu(m, 1, 1, memfit.EngineLimits(BATCHED, 1024)),
        memfit.kv_shards(m, 1, 1))
    assert memfit.planned_context(m, budget, BATCHED, cushion=cushion) <= accepted


@pytest.mark.parametrize("budget_gib", [2.1, 2.3])
def test_nemotron_h_gets_exactly_the_context_vllms_engine_accepts(budget_gib: float) -> None:
    # 10 attention layers and 54 Mamba ones: vLLM's engine groups them in 7 groups of 10 (the
    # Mamba layers padded to 60) and counts every group, padding included, in its check
    # (_max_memory_usage_bytes_from_groups), after keeping back one pool block of 10 pages of
    # 4,128 tokens (0.16 GiB) for its null block: no context at 2.1 GiB, 4,128 at 2.3
    m = _spec(NEMOTRON_H)
    budget = budget_gib * GIB
    assert memfit.longest_context(m, budget, BATCHED) == _accepted(NEMOTRON_H, budget)


def test_a_dense_model_keeps_vllms_null_block_out_of_its_context() -> None:
    # one 16-token block of all 80 layers (5 MiB) is held back: 4,896 tokens, not 4,912
    folder = RECENT / "llama-3.1-70b-instruct-fp8"
    m = load_model_spec(str(folder))
    accepted = vllm_accepts(read_config(folder), int(1.5 * GIB))
    assert memfit.longest_context(m, 1.5 * GIB, BATCHED) == accepted


@pytest.mark.parametrize("tp", [4, 8])
def test_qwen3_next_past_its_two_kv_heads_gets_the_smaller_blocks_of_its_divided_state(
    tp: int,
) -> None:
    # 2 KV heads: from TP 4 each GPU keeps a whole head while its gated delta-net state keeps
    # dividing, so a state page fills fewer attention tokens and the block shrinks
    m = _spec(QWEN3_NEXT)
    share = memfit.tp_share(m, tp)
    assert memfit.state_block_tokens(share) < memfit.state_block_tokens(m)
    replica = GIB * memfit.kv_shards(m, tp, 1)
    assert memfit.longest_context(share, replica, BATCHED) == _accepted(QWEN3_NEXT, GIB, tp)


def test_a_hybrid_within_its_kv_heads_keeps_its_one_gpu_page_ratio() -> None:
    m = _spec(NEMOTRON_H)  # 8 KV heads: attention and state both divide up to TP 8
    assert memfit.tp_share(m, 8) == m


@pytest.mark.parametrize("name", [QWEN3_NEXT, NEMOTRON_H])
def test_a_hybrids_attention_block_holds_one_recurrent_state_page(name: str) -> None:
    specs, _, _ = vllm_specs(read_config(RECENT / name), Engine())
    assert memfit.state_block_tokens(_spec(name)) == specs["attn.0"].block_size


def test_a_hybrid_request_holds_its_state_pages_whatever_its_length() -> None:
    m = _spec(QWEN3_NEXT)
    block = memfit.state_block_tokens(m)  # 544 tokens
    page = block * 2 * 2 * 256 * 2  # one attention layer's page: K and V, 2 heads of 256, bf16
    state = 36 * ALIGN_STATE_PAGES * page
    assert memfit.request_kv_bytes(m, 1, BATCHED) == 12 * page + state
    assert memfit.request_kv_bytes(m, 10 * block, BATCHED) == 12 * 10 * page + state


def test_qwen3_next_runs_one_attention_and_three_recurrent_groups() -> None:
    m = _spec(QWEN3_NEXT)
    assert memfit.vllm_group_count(m) == 4
    # a request of one block takes one block of the attention group and two of each of the
    # three recurrent groups
    assert memfit.request_blocks(m, 1, BATCHED) == 1 + 3 * ALIGN_STATE_PAGES


def test_a_model_without_recurrent_layers_keeps_vllms_plain_block() -> None:
    m = _spec("gpt-oss-120b")
    assert memfit.state_block_tokens(m) == memfit.BLOCK_TOKENS
    assert memfit.recurrent_group_layers(m) == 0
