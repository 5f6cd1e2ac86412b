"""The memory fit of hybrid attention + Mamba / linear-attention models against vLLM's own rule.

vLLM raises a hybrid model's attention block until one attention page (one layer) holds a
recurrent layer's state page, pads the state page to it, and its start-up check counts each
recurrent layer's pages per request whatever the length. The references here are vLLM's own
pieces, run on the CPU: its state-shape and dtype calculators and its MambaSpec /
FullAttentionSpec over the fixtures' real configs (read by transformers), its attention
backend's kernel block size, and its ``estimate_max_model_len`` bisection over those specs.
Only the block-size rule itself (vllm/platforms/interface.py ``_align_hybrid_block_size``,
which needs a whole engine config) is re-stated here, in one line."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from transformers import AutoConfig
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
)
from vllm.model_executor.models.config import NemotronHForCausalLMConfig
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
from vllm.v1.core.kv_cache_utils import estimate_max_model_len
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec, MambaSpec

from launcher.model.modelspec import ALIGN_STATE_PAGES, GIB, ModelSpec, load_model_spec
from launcher.planner import memfit
from tests.launcher.paths import REPO

RECENT = REPO / "tests" / "fixtures" / "recent-models"
QWEN3_NEXT = "qwen3-next-80b-a3b-thinking"
NEMOTRON_H = "nemotron-h-56b-base-8k"
BATCHED = 8192


def _engine(max_model_len: int, ssm_dtype: str = "auto") -> Any:
    """The few fields of a VllmConfig that vLLM's spec and estimate functions read: one GPU,
    prefix caching on (mamba_cache_mode 'align', as every plan runs)."""
    return cast(Any, SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len, dtype=torch.bfloat16),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, decode_context_parallel_size=1),
        cache_config=SimpleNamespace(mamba_cache_mode="align", mamba_cache_dtype="auto",
                                     mamba_ssm_cache_dtype=ssm_dtype),
        speculative_config=None,
    ))


def _vllm_specs(name: str) -> tuple[dict[str, KVCacheSpec], Any]:
    """vLLM's per-layer KV specs for the fixture ``name`` on one GPU, hybrid block size applied."""
    hf = AutoConfig.from_pretrained(RECENT / name)
    engine = _engine(hf.max_position_embeddings)
    if name == NEMOTRON_H:
        NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(
            cache_config=engine.cache_config, hf_config=hf)
        shapes: tuple[tuple[int, ...], ...] = MambaStateShapeCalculator.mamba2_state_shape(
            1, hf.mamba_num_heads * hf.mamba_head_dim, hf.n_groups, hf.mamba_num_heads,
            hf.mamba_head_dim, hf.ssm_state_size, hf.conv_kernel)
        kinds = list(hf.hybrid_override_pattern)
        attention, recurrent = kinds.count("*"), kinds.count("M")
        head_dim = hf.head_dim
    else:
        shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
            1, hf.linear_num_key_heads, hf.linear_num_value_heads, hf.linear_key_head_dim,
            hf.linear_value_head_dim, hf.linear_conv_kernel_dim)
        attention = hf.layer_types.count("full_attention")
        recurrent = hf.layer_types.count("linear_attention")
        head_dim = hf.head_dim
    dtypes = MambaStateDtypeCalculator.mamba2_state_dtype(
        torch.bfloat16, "auto", engine.cache_config.mamba_ssm_cache_dtype)
    state_page = MambaSpec(block_size=-1, shapes=shapes, dtypes=dtypes).page_size_bytes
    token_page = FullAttentionSpec(block_size=1, num_kv_heads=hf.num_key_value_heads,
                                   head_size=head_dim, dtype=torch.bfloat16).page_size_bytes
    kernel = FlashAttentionBackend.get_supported_kernel_block_sizes()[0]
    kernel_block = max(getattr(kernel, "base", kernel), memfit.BLOCK_TOKENS)
    block = kernel_block * -(-state_page // (kernel_block * token_page))  # the re-stated rule
    specs: dict[str, KVCacheSpec] = {
        f"attn.{i}": FullAttentionSpec(block_size=block, num_kv_heads=hf.num_key_value_heads,
                                       head_size=head_dim, dtype=torch.bfloat16)
        for i in range(attention)
    }
    specs |= {
        f"mamba.{i}": MambaSpec(block_size=block, shapes=shapes, dtypes=dtypes,
                                page_size_padded=block * token_page, mamba_cache_mode="align")
        for i in range(recurrent)
    }
    return specs, engine


def _spec(name: str) -> ModelSpec:
    return load_model_spec(str(RECENT / name))


def _vllm_longest(name: str, budget: float) -> int:
    specs, engine = _vllm_specs(name)
    return estimate_max_model_len(engine, specs, int(budget))


@pytest.mark.parametrize("budget_gib", [1.5, 4.0])
def test_qwen3_next_gets_exactly_the_context_vllms_own_check_accepts(budget_gib: float) -> None:
    # 12 attention layers and 36 linear-attention ones: groups of 12 need no padding, so
    # memfit's need is vLLM's to the byte
    m = _spec(QWEN3_NEXT)
    budget = budget_gib * GIB
    accepted = _vllm_longest(QWEN3_NEXT, budget)
    assert 0 < accepted < m.max_position_embeddings
    assert memfit.longest_context(m, budget, BATCHED) == accepted
    assert memfit.planned_context(m, budget, BATCHED) <= accepted


@pytest.mark.parametrize("budget_gib", [2.1, 2.3])
def test_nemotron_h_never_plans_more_context_than_vllm_accepts(budget_gib: float) -> None:
    # 54 Mamba layers beside 10 attention ones, 1.7 GiB of state a sequence in 4,128-token
    # blocks: memfit counts the Mamba layers as vLLM's pool pads them (60), above the check's
    # own count of 54 (at 2.1 GiB memfit admits 4,128 tokens where vLLM's check takes 8,192)
    m = _spec(NEMOTRON_H)
    budget = budget_gib * GIB
    accepted = _vllm_longest(NEMOTRON_H, budget)
    assert accepted > 0
    assert 0 < memfit.planned_context(m, budget, BATCHED) <= accepted


@pytest.mark.parametrize("name", [QWEN3_NEXT, NEMOTRON_H])
def test_a_hybrids_attention_block_holds_one_recurrent_state_page(name: str) -> None:
    specs, _ = _vllm_specs(name)
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
