"""A model's shape as Hugging Face transformers defines it: its config class and its modules.

``config.json`` leaves out whatever its config class defaults (Gemma 3's vocabulary, its
sliding-window pattern, Gemma 4's global head size...). So the config is read through the
model_type's own config class (``transformers.CONFIG_MAPPING``), and the model is built on
PyTorch's ``meta`` device (no memory, no weights: ~0.1-0.5 s) to count what each module holds:
embeddings, decoder linear layers, experts, vision towers, and each layer's attention (its KV
heads, head size, sliding window, or whether it reuses another layer's KV cache).

Used by :mod:`launcher.modelspec`; ``None`` when transformers cannot build the model (an
unknown model_type, remote code, a config its class rejects), and the caller then sizes the
model from config.json's fields alone.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# Module names of parts vLLM keeps in 16 bits whatever the checkpoint's quantization.
_TOWERS = ("vision", "audio", "multi_modal_projector", "embed_vision", "embed_audio", "mm_")


@dataclass(frozen=True)
class LayerAttention:
    kv_heads: int
    head_dim: int
    window: int | None  # sliding-window layers keep this many tokens; None: full attention
    shared: bool  # reuses an earlier layer's KV cache (Gemma 4's last layers): holds none


@dataclass(frozen=True)
class HfShape:
    model_type: str
    text: Mapping[str, Any]  # the text config's fields, defaults filled in
    embedding_params: int  # every embedding table (per-layer input embeddings too)
    lm_head_params: int  # 0 when tied to the input embedding
    linear_params: int  # decoder linear layers and experts: what a quantization packs
    expert_params: int  # of which routed experts
    other_params: int  # norms, biases, towers: 16-bit
    attention: tuple[LayerAttention, ...]
    transformers_version: str
    rope_cache_elems: int = 0  # vLLM's rotary cos/sin tables: one per distinct rotary setting


def _quiet() -> contextlib.AbstractContextManager[Any]:
    return contextlib.redirect_stderr(io.StringIO())


@lru_cache(maxsize=64)
def _shape(cfg_json: str) -> HfShape | None:
    import json

    try:
        import torch
        import transformers
        from transformers import CONFIG_MAPPING
    except ImportError:
        return None
    cfg = json.loads(cfg_json)
    model_type = str(cfg.get("model_type", ""))
    if model_type not in CONFIG_MAPPING:
        return None
    cfg.pop("quantization_config", None)  # sized here as bf16; the caller applies the packing
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        with _quiet():
            conf = CONFIG_MAPPING[model_type].from_dict(cfg)
            text = conf.get_text_config()
            with torch.device("meta"):
                model = _build(conf)
    except Exception:  # a config its own class cannot build: size from the fields instead
        return None
    if model is None:
        return None
    try:
        return _count(model, conf, text, model_type, transformers.__version__)
    except Exception:  # a module layout this reader does not know: size from the fields
        return None


def _build(conf: Any) -> Any:
    import transformers

    auto: Any = transformers  # its Auto classes carry no type hints
    try:
        return auto.AutoModelForCausalLM.from_config(conf)
    except ValueError:  # a multimodal config without a causal-LM mapping
        return auto.AutoModelForImageTextToText.from_config(conf)


def _count(model: Any, conf: Any, text: Any, model_type: str, version: str) -> HfShape:
    import torch

    emb = head = linear = experts = other = 0
    tied = bool(getattr(text, "tie_word_embeddings", getattr(conf, "tie_word_embeddings", True)))
    seen: set[int] = set()
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue  # a tied LM head is the embedding's own tensor
            seen.add(id(p))
            n = p.numel()
            full = f"{name}.{pname}"
            if any(t in full for t in _TOWERS):
                other += n
            elif isinstance(module, torch.nn.Embedding):
                emb += n
            elif name.endswith("lm_head"):
                head += 0 if tied else n
            elif "experts" in full and p.dim() >= 2:
                linear += n
                experts += n
            elif isinstance(module, torch.nn.Linear) and pname == "weight" and "router" not in full:
                linear += n
            else:
                other += n
    # Gemma 4's keys-equal-values layers ship k_proj only; vLLM loads it into both the K and V
    # slots of its fused QKV weight (vllm/model_executor/models/gemma4.py), so it holds a copy.
    for layer in _decoder_layers(model):
        attn = getattr(layer, "self_attn", None)
        k = getattr(attn, "k_proj", None)
        if getattr(attn, "use_alternative_attention", False) and k is not None:
            linear += k.weight.numel()
    return HfShape(
        model_type=model_type,
        text=text.to_dict(),
        embedding_params=emb,
        lm_head_params=head,
        linear_params=linear,
        expert_params=experts,
        other_params=other,
        attention=(attn := _attention(model, text)),
        transformers_version=version,
        rope_cache_elems=_rope_cache_elems(text, attn),
    )


def _rope_cache_elems(text: Any, attn: tuple[LayerAttention, ...]) -> int:
    """vLLM keeps one cos/sin table per distinct rotary setting (its get_rope() caches them):
    ``positions × head size`` rows in the model's dtype, positions stretched by a linear
    scaling factor. Configs that give each layer type its own rotary parameters (Gemma 3 and
    4: ``rope_parameters`` keyed by layer type) get a table per type, at that type's head size.
    """
    params = getattr(text, "rope_parameters", None) or {}
    positions = int(getattr(text, "max_position_embeddings", 0) or 0)

    def rows(p: Mapping[str, Any]) -> int:
        linear = p.get("rope_type") == "linear"
        return int(positions * (float(p.get("factor", 1.0)) if linear else 1.0))

    per_type = isinstance(params, Mapping) and all(isinstance(v, Mapping) for v in params.values())
    if per_type and params:
        tables = set()
        for a in attn:
            kind = "sliding_attention" if a.window else "full_attention"
            p = params.get(kind) or {}
            tables.add((kind, rows(p), a.head_dim))
        return sum(r * d for _, r, d in tables)
    head = attn[0].head_dim if attn else 0
    return rows(params if isinstance(params, Mapping) else {}) * head


def _decoder_layers(model: Any) -> list[Any]:
    for name, module in model.named_modules():
        if name.endswith(".layers") and "vision" not in name and "audio" not in name:
            return list(module)
    return []


def _attention(model: Any, text: Any) -> tuple[LayerAttention, ...]:
    types = getattr(text, "layer_types", None) or []
    out = []
    for i, layer in enumerate(_decoder_layers(model)):
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            continue
        head_dim = int(getattr(attn, "head_dim", 0) or text.hidden_size // text.num_attention_heads)
        k = getattr(attn, "k_proj", None)
        shared = bool(getattr(attn, "is_kv_shared_layer", False))
        if k is not None:
            kv = int(k.out_features // head_dim)
        else:  # a layer without its own K projection reads another layer's cache
            kv = 0 if shared else int(getattr(attn, "num_key_value_heads", 0) or 0)
        sliding = (i < len(types) and types[i] == "sliding_attention") or bool(
            getattr(attn, "is_sliding", False)
        )
        window = getattr(text, "sliding_window", None) if sliding else None
        out.append(LayerAttention(kv, head_dim, int(window) if window else None, shared))
    return tuple(out)


def shape(cfg: Mapping[str, Any]) -> HfShape | None:
    """The model of ``cfg`` (a parsed config.json) as transformers builds it, or None."""
    import json

    try:
        key = json.dumps(cfg, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return None
    return _shape(key)
