"""The longest context vLLM 0.32 accepts for a KV budget, from vLLM's own code run on the CPU.

The engine core sizes the KV cache with ``get_kv_cache_configs`` (vllm/v1/engine/core.py): it
groups the layers' specs (``get_kv_cache_groups``, padding included), keeps one pool block back
for the null block, and refuses to start when one request of ``max_model_len`` does not fit
(``_check_enough_kv_cache_memory`` over ``_max_memory_usage_bytes_from_groups``); with
``max_model_len`` -1 it bisects for the longest that does (``_auto_fit_max_model_len``). That
call is run here as it is, so the figure is the engine's own. (``estimate_max_model_len`` over
the ungrouped specs, which the engine no longer calls, neither pads groups nor keeps the null
block back.)

What vLLM would build from a checkpoint is re-stated per family from the real config.json, one
GPU's share at TP ``tp`` as the workers report it: its attention specs (full, sliding window,
chunked local, latent), and a hybrid's recurrent state through vLLM's own shape and dtype
calculators, with the attention block raised until one attention page holds a state page
(vllm/platforms/interface.py ``_align_hybrid_block_size``, which needs a whole engine config:
its rule is re-stated in one line). GPU defaults: block 16, bf16, prefix caching on (mamba
cache mode 'align'), two batches in flight, the default layer-outer layout (LBNHC)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import torch
from transformers import AutoConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
)
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import (
    get_kv_cache_configs,
    get_max_concurrency_for_kv_cache_config,
)
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

BLOCK = 16  # FlashAttention's kernel block and vLLM's default on the GPU
DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Engine:
    """What the engine is started with, as far as the KV check reads it."""

    tp: int = 1
    batched_tokens: int = 8192
    in_flight: int = 2  # async scheduling: two batches scheduled before the first settles
    # vLLM's hybrid KV-cache manager (off: every local layer of a model that also has full
    # attention is given full-attention blocks, unify_hybrid_kv_cache_specs)
    hybrid_kv: bool = True


def _text(cfg: dict[str, Any]) -> dict[str, Any]:
    return cast(dict[str, Any], cfg.get("text_config") or cfg)


def read_config(folder: Path) -> dict[str, Any]:
    """The text model's config with transformers' defaults filled in (layer_types among them);
    config.json as it is for a model_type transformers does not define (its own code is not
    run)."""
    raw = cast(dict[str, Any], json.loads((folder / "config.json").read_text()))
    if raw.get("model_type") not in CONFIG_MAPPING:
        return _text(raw)
    config = AutoConfig.from_pretrained(folder).get_text_config()
    # layer_types and the layer count are properties on some configs (Nemotron-H), not fields
    derived = {k: getattr(config, k) for k in ("layer_types", "num_hidden_layers")
               if getattr(config, k, None) is not None}
    # Gemma 4's layers differ in head size and KV heads (per_layer_config, as vLLM's
    # Gemma4DecoderLayer reads them)
    if (per_layer := getattr(config, "per_layer_config", None)) is not None:
        derived["per_layer"] = [(c.head_dim, c.num_key_value_heads) for c in per_layer]
    return {**config.to_dict(), **derived}


def _config(engine: Engine, max_len: int, ssm_dtype: str) -> Any:
    """The fields of a VllmConfig that get_kv_cache_configs and the specs read."""
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_len, original_max_model_len=-1,
                                     dtype=DTYPE),
        parallel_config=SimpleNamespace(tensor_parallel_size=engine.tp,
                                        decode_context_parallel_size=1),
        cache_config=SimpleNamespace(
            mamba_cache_mode="align", mamba_cache_dtype="auto", mamba_ssm_cache_dtype=ssm_dtype,
            num_gpu_blocks_override=None, prefix_cache_retention_interval=None,
            kv_cache_layout="LBNHC",
            get_resolved_kv_cache_layout=lambda: _layout("LBNHC")),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=not engine.hybrid_kv),
        attention_config=SimpleNamespace(hisparse_config=None),
        speculative_config=None,
        device_config=SimpleNamespace(device_type="cuda"),
        num_prefill_lookahead_tokens=0,
        max_in_flight_tokens=engine.in_flight * engine.batched_tokens,
    )


def _layout(name: str) -> Any:
    from vllm.v1.kv_cache_layout import KVCacheLayout
    return KVCacheLayout[name]


def _ssm_dtype(t: dict[str, Any], model_type: str) -> str:
    """vLLM's mamba_ssm_cache_dtype under 'auto' (vllm/model_executor/models/config.py):
    Nemotron-H's config value or float32, Qwen3.5's mamba_ssm_dtype, else the model's."""
    if model_type == "nemotron_h":
        return str(t.get("mamba_ssm_cache_dtype") or "float32")
    if model_type.startswith("qwen3_5") and t.get("mamba_ssm_dtype"):
        return str(t["mamba_ssm_dtype"])
    return "auto"


def _state(t: dict[str, Any], model_type: str, tp: int, ssm_dtype: str) -> tuple[Any, Any, int]:
    """A recurrent layer's state shapes and dtypes on one of ``tp`` GPUs, and the layer count."""
    if model_type == "nemotron_h":
        shapes = MambaStateShapeCalculator.mamba2_state_shape(
            tp, t["mamba_num_heads"] * t["mamba_head_dim"], t["n_groups"], t["mamba_num_heads"],
            t["mamba_head_dim"], t["ssm_state_size"], t["conv_kernel"])
        dtypes = MambaStateDtypeCalculator.mamba2_state_dtype(DTYPE, "auto", ssm_dtype)
        return shapes, dtypes, t["layer_types"].count("linear_attention")
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
        tp, t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"],
        t["linear_value_head_dim"], t["linear_conv_kernel_dim"])
    dtypes = MambaStateDtypeCalculator.gated_delta_net_state_dtype(DTYPE, "auto", ssm_dtype)
    return shapes, dtypes, t["layer_types"].count("linear_attention")


def _attention_kinds(t: dict[str, Any], model_type: str) -> list[str]:
    """Each attention layer's kind: 'full', 'sliding' or 'chunked' (recurrent and MLP-only
    layers left out), from the layer_types transformers fills in (Gemma's patterns, Llama 4's
    chunked layers, Nemotron-H's hybrid_override_pattern)."""
    kinds = {"full_attention": "full", "sliding_attention": "sliding",
             "chunked_attention": "chunked"}
    if types := t.get("layer_types"):
        return [kinds[k] for k in types if k in kinds]
    return ["full"] * int(t["num_hidden_layers"])


def vllm_specs(t: dict[str, Any], engine: Engine) -> tuple[dict[str, KVCacheSpec], str, int]:
    """vLLM's per-layer KV specs of one GPU at ``engine.tp``, its mamba_ssm_cache_dtype and the
    model's own longest context."""
    model_type = str(t.get("model_type"))
    ssm_dtype = _ssm_dtype(t, model_type)
    max_len = int(t["max_position_embeddings"])
    kinds = _attention_kinds(t, model_type)
    specs: dict[str, KVCacheSpec] = {}
    if t.get("kv_lora_rank"):
        head = int(t["kv_lora_rank"]) + int(t["qk_rope_head_dim"])
        for i in range(len(kinds)):
            specs[f"attn.{i}"] = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1,
                                                  head_size=head, dtype=DTYPE)
        return specs, ssm_dtype, max_len
    kv_total = int(t.get("num_key_value_heads") or t["num_attention_heads"])
    kv_heads = max(1, kv_total // engine.tp)
    head_dim = int(t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"])
    token_page = FullAttentionSpec(block_size=1, num_kv_heads=kv_heads, head_size=head_dim,
                                   dtype=DTYPE).page_size_bytes
    block = BLOCK
    recurrent = 0
    if model_type == "nemotron_h" or t.get("linear_num_value_heads"):
        shapes, dtypes, recurrent = _state(t, model_type, engine.tp, ssm_dtype)
        state_page = MambaSpec(block_size=-1, shapes=shapes, dtypes=dtypes).page_size_bytes
        kernel = FlashAttentionBackend.get_supported_kernel_block_sizes()[0]
        kernel_block = max(getattr(kernel, "base", kernel), BLOCK)
        # the re-stated rule of _align_hybrid_block_size
        block = kernel_block * -(-state_page // (kernel_block * token_page))
    shapes_of = t.get("per_layer") or [(head_dim, kv_total)] * len(kinds)
    # KV-sharing layers (Gemma's num_kv_shared_layers, the last ones) keep no cache of their own
    own = len(kinds) - int(t.get("num_kv_shared_layers") or 0)
    for i, (kind, (size, heads)) in enumerate(zip(kinds[:own], shapes_of, strict=False)):
        common = dict(block_size=block, num_kv_heads=max(1, int(heads) // engine.tp),
                      head_size=int(size), dtype=DTYPE)
        if kind == "sliding":
            specs[f"attn.{i}"] = SlidingWindowSpec(sliding_window=int(t["sliding_window"]),
                                                   **common)
        elif kind == "chunked":
            specs[f"attn.{i}"] = ChunkedLocalAttentionSpec(
                attention_chunk_size=int(t["attention_chunk_size"]), **common)
        else:
            specs[f"attn.{i}"] = FullAttentionSpec(**common)
    for i in range(recurrent):
        specs[f"state.{i}"] = MambaSpec(block_size=block, shapes=shapes, dtypes=dtypes,
                                        page_size_padded=block * token_page,
                                        mamba_cache_mode="align")
    return specs, ssm_dtype, max_len


def vllm_accepts(t: dict[str, Any], kv_bytes_per_gpu: int, engine: Engine = Engine()) -> int:
    """The max_model_len vLLM's engine core settles on (auto-fit) with ``kv_bytes_per_gpu`` of
    KV cache on each GPU: the model's own limit when that fits, 0 where not one token does."""
    specs, ssm_dtype, max_len = vllm_specs(t, engine)
    config = _config(engine, max_len, ssm_dtype)
    try:
        get_kv_cache_configs(config, [specs], [int(kv_bytes_per_gpu)])
    except ValueError:
        return 0
    return int(config.model_config.max_model_len)


@dataclass(frozen=True)
class Pool:
    """vLLM's KV pool for requests of ``max_model_len`` tokens, as its engine core makes it."""

    num_blocks: int  # KVCacheConfig.num_blocks: the blocks the memory holds
    concurrency: float  # its logged "Maximum concurrency": num_blocks over one request's blocks
    free_blocks: int  # what a fresh BlockPool of them has to hand out (the null block taken)


def vllm_pool(t: dict[str, Any], kv_bytes_per_gpu: int, max_model_len: int,
              engine: Engine = Engine()) -> Pool:
    """The pool vLLM's engine core makes of ``kv_bytes_per_gpu`` with ``max_model_len`` asked
    (no auto-fit: ValueError where one such request does not pass its check)."""
    specs, ssm_dtype, _ = vllm_specs(t, engine)
    config = _config(engine, max_model_len, ssm_dtype)
    config.model_config.original_max_model_len = max_model_len
    kv = get_kv_cache_configs(config, [specs], [int(kv_bytes_per_gpu)])[0]
    blocks = BlockPool(kv.num_blocks, enable_caching=True, hash_block_size=BLOCK)
    return Pool(kv.num_blocks, get_max_concurrency_for_kv_cache_config(config, kv),
                blocks.get_num_free_blocks())
