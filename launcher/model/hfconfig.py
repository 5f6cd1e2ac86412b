"""A model's shape as Hugging Face transformers defines it: its config class and its modules.

``config.json`` leaves out whatever its config class defaults (Gemma 3's vocabulary, its
sliding-window pattern, Gemma 4's global head size...). So the config is read through the
model_type's own config class (``transformers.CONFIG_MAPPING``), and the model is built on
PyTorch's ``meta`` device (no memory, no weights: ~0.1-0.5 s) to count what each module holds:
embeddings, decoder linear layers, experts, vision towers, and each layer's attention (its KV
heads, head size, sliding window, or whether it reuses another layer's KV cache).

Used by :mod:`launcher.model.modelspec`; ``None`` when transformers cannot build the model (an
unknown model_type, remote code, a config its class rejects), and the caller then sizes the
model from config.json's fields alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

# Module names of parts vLLM keeps in 16 bits whatever the checkpoint's quantization.
_TOWERS = ("vision", "audio", "multi_modal_projector", "embed_vision", "embed_audio", "mm_")


@dataclass(frozen=True)
class LayerAttention:
    kv_heads: int
    head_dim: int
    window: int | None  # sliding-window layers keep this many tokens; None: full attention
    shared: bool  # reuses an earlier layer's KV cache (Gemma 4's last layers): holds none
    # Multi-head latent attention (DeepSeek V2/V3, Kimi K2): the cache holds one compressed
    # vector of ``head_dim`` = kv_lora_rank + qk_rope_head_dim per token, no separate V.
    latent: bool = False
    # Chunked attention (Llama 4's RoPE layers): ``window`` is the chunk a token attends within
    # (attention_chunk_size), not a sliding window; the cache keeps one chunk either way
    chunked: bool = False


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
    # of other_params: the vision/audio towers and their projectors, which run for a request's
    # images or audio only, never for a text token
    tower_params: int = 0
    # The recurrent layers of a hybrid model (Mamba2: Nemotron-H, Granite 4.0-H, Falcon-H1;
    # gated delta-net linear attention: Qwen3-Next, Qwen3.5), which keep no KV cache but a
    # fixed state per sequence, summed over those layers (elements): the causal convolution's
    # last kernel-1 inputs and the recurrence's own state (see _recurrent_state)
    recurrent_layers: int = 0
    recurrent_conv_elems: int = 0
    recurrent_state_elems: int = 0
    # ``linear_params`` module by module: (name, parameters), a mixture's routed experts as
    # one module per layer (``model.layers.0.mlp.experts``, as vLLM fuses them), so that a
    # checkpoint's list of modules left unquantized (quantization.Unquantized) can be counted
    linear_modules: tuple[tuple[str, int], ...] = ()


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
    # Never the model's own code: a config whose auto_map names it (Kimi-K2.5's) would otherwise
    # have transformers ask "Do you wish to run the custom code? [y/N]" on stdout and wait for
    # an answer, inside `launcher plan` (its --json output then no JSON). Refused, the build
    # raises ValueError: transformers' own class where it has one, else sized from the fields.
    try:
        try:
            return auto.AutoModelForCausalLM.from_config(conf, trust_remote_code=False)
        except ValueError:  # a multimodal config without a causal-LM mapping
            return auto.AutoModelForImageTextToText.from_config(conf, trust_remote_code=False)
    except ImportError:
        # A tower needs a library this environment lacks (Gemma 3n's vision tower is timm's):
        # count the language model alone. The towers' weights are then missing from the count,
        # but a checkpoint's own size (its safetensors index) still replaces it.
        text = conf.get_text_config()
        if text is conf:
            raise
        return auto.AutoModelForCausalLM.from_config(text, trust_remote_code=False)


def _count(model: Any, conf: Any, text: Any, model_type: str, version: str) -> HfShape:
    import torch

    emb = head = linear = experts = other = towers = 0
    modules: dict[str, int] = {}
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
                towers += n
            elif isinstance(module, torch.nn.Embedding):
                emb += n
            elif name.endswith("lm_head"):
                head += 0 if tied else n
            elif "experts" in full and "shared_expert" not in full and p.dim() >= 2:
                # (DeepSeek's shared_experts run for every token: dense, not routed)
                linear += n
                experts += n
                fused = _experts_module(name)
                modules[fused] = modules.get(fused, 0) + n
            elif isinstance(module, torch.nn.Linear) and pname == "weight" and "router" not in full:
                linear += n
                modules[name] = modules.get(name, 0) + n
            else:
                other += n
    # Gemma 4's keys-equal-values layers ship k_proj only; vLLM loads it into both the K and V
    # slots of its fused QKV weight (vllm/model_executor/models/gemma4.py), so it holds a copy.
    named = {id(mod): n for n, mod in model.named_modules()}
    for layer in _decoder_layers(model):
        attn = getattr(layer, "self_attn", None)
        k = getattr(attn, "k_proj", None)
        if getattr(attn, "use_alternative_attention", False) and k is not None:
            linear += k.weight.numel()
            owner = named.get(id(k), "k_proj")
            modules[owner] = modules.get(owner, 0) + k.weight.numel()
    layers, conv, state = _recurrent_state(model)
    return HfShape(
        model_type=model_type,
        text=_text_fields(text),
        embedding_params=emb,
        lm_head_params=head,
        linear_params=linear,
        expert_params=experts,
        other_params=other,
        attention=(attn := _attention(model, text)),
        transformers_version=version,
        rope_cache_elems=_rope_cache_elems(text, attn),
        tower_params=towers,
        recurrent_layers=layers,
        recurrent_conv_elems=conv,
        recurrent_state_elems=state,
        linear_modules=tuple(modules.items()),
    )


def _experts_module(name: str) -> str:
    """The routed-experts module a parameter's module ``name`` belongs to: the name up to its
    ``experts`` part (one expert's ``...mlp.experts.3.w1`` is ``...mlp.experts``)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if "experts" in part and "shared_expert" not in part:
            return ".".join(parts[:i + 1])
    return name


def _count_attr(module: Any, *names: str) -> int:
    """The product of the module's integer attributes ``names``; 0 where one is missing."""
    product = 1
    for name in names:
        value = getattr(module, name, None)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            return 0
        product *= value
    return product


def _recurrent_state(model: Any) -> tuple[int, int, int]:
    """(recurrent layers, conv-state elements, recurrence-state elements) one sequence holds,
    summed over the decoder layers whose mixer runs a causal convolution, as vLLM sizes their
    cache (vllm/model_executor/layers/mamba/mamba_utils.py, MambaStateShapeCalculator): the
    convolution keeps its channels x (kernel - 1) last inputs; a gated delta-net keeps
    num_v_heads x head_v_dim x head_k_dim, a Mamba2 mixer num_heads x head_dim x
    ssm_state_size, a Mamba1 mixer intermediate_size x ssm_state_size, a Kimi delta attention
    num_heads x head_dim x head_dim; a short convolution alone (LFM2's) keeps no more."""
    import torch

    layers = conv = state = 0
    for layer in _decoder_layers(model):
        for name, module in layer.named_modules():
            if not isinstance(module, torch.nn.Conv1d):
                continue
            mixer = layer.get_submodule(name.rsplit(".", 1)[0]) if "." in name else layer
            layers += 1
            conv += module.in_channels * max(0, module.kernel_size[0] - 1)
            state += (_count_attr(mixer, "num_v_heads", "head_v_dim", "head_k_dim")
                      or _count_attr(mixer, "num_heads", "head_dim", "ssm_state_size")
                      or _count_attr(mixer, "intermediate_size", "ssm_state_size")
                      or _count_attr(mixer, "num_heads", "head_dim", "head_dim"))
            break
    return layers, conv, state


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
    if attn and attn[0].latent:  # MLA rotates only the rope part of its keys
        head = int(getattr(text, "qk_rope_head_dim", 0) or 0)
    flat = params if isinstance(params, Mapping) else {}
    partial = flat.get("partial_rotary_factor", getattr(text, "partial_rotary_factor", None))
    if isinstance(partial, (int, float)) and not isinstance(partial, bool) and 0 < partial < 1:
        head = int(head * partial)  # vLLM's table spans the rotary dimensions only
    return rows(flat) * head


# The sizes the planner reads from every text config (modelspec._dims and its callers)
_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
          "head_dim", "vocab_size", "intermediate_size", "max_position_embeddings")


def _text_fields(text: Any) -> dict[str, Any]:
    """The text config's fields, with each size a config class keeps behind a property that
    to_dict() leaves out (NemotronHConfig derives num_hidden_layers from layers_block_type, and
    Nemotron 3 Ultra's config.json gives only the latter) read from the class itself."""
    fields = _plain(text.to_dict())
    for key in _SIZES:
        value = getattr(text, key, None) if key not in fields else None
        if isinstance(value, int) and not isinstance(value, bool):
            fields[key] = value
    return fields


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields as JSON gives them back (``id2label``'s int keys become strings), so that a
    shape read from the disk cache equals the one counted; unchanged if JSON cannot hold them."""
    import json

    try:
        plain = json.loads(json.dumps(fields))
    except (TypeError, ValueError):
        return fields
    return plain if isinstance(plain, dict) else fields


def _decoder_layers(model: Any) -> list[Any]:
    for name, module in model.named_modules():
        if name.endswith(".layers") and "vision" not in name and "audio" not in name:
            return list(module)
    return []


def _self_attention(layer: Any) -> Any:
    """A decoder layer's attention module, or None where the layer has none (a Mamba or
    linear-attention layer of a hybrid model, which keeps no KV cache). Most families name it
    ``self_attn``; Nemotron-H's blocks hold one ``mixer`` each, attention in some of them, a
    Mamba2 mixer or an MLP in the others: attention is the mixer with a key projection."""
    import torch

    attn = getattr(layer, "self_attn", None)
    if attn is not None:
        # Kimi-Linear names its delta-attention mixer self_attn too: a causal convolution
        # inside marks it a recurrent layer (_recurrent_state), with no KV cache
        recurrent = any(isinstance(m, torch.nn.Conv1d) for m in attn.modules())
        return None if recurrent else attn
    mixer = getattr(layer, "mixer", None)
    return mixer if getattr(mixer, "k_proj", None) is not None else None


def _attention(model: Any, text: Any) -> tuple[LayerAttention, ...]:
    types = getattr(text, "layer_types", None) or []
    out = []
    for i, layer in enumerate(_decoder_layers(model)):
        attn = _self_attention(layer)
        if attn is None:
            continue
        rank = getattr(text, "kv_lora_rank", None)
        if isinstance(rank, int) and rank > 0 and getattr(attn, "kv_a_proj_with_mqa", None):
            # vLLM caches the latent vector and the rotary key once per token, whatever the
            # head count (MLAAttentionSpec: one KV head of kv_lora_rank + qk_rope_head_dim).
            latent = rank + int(getattr(text, "qk_rope_head_dim", 0) or 0)
            out.append(LayerAttention(1, latent, None, False, latent=True))
            continue
        head_dim = int(getattr(attn, "head_dim", 0) or text.hidden_size // text.num_attention_heads)
        k = getattr(attn, "k_proj", None)
        shared = bool(getattr(attn, "is_kv_shared_layer", False))
        if k is not None:
            kv = int(k.out_features // head_dim)
        else:  # a layer without its own K projection reads another layer's cache
            kv = 0 if shared else int(getattr(attn, "num_key_value_heads", 0) or 0)
        if kv <= 0 and not shared:
            # A fused or unfamiliar projection (Persimmon's query_key_value): the config's own
            # head counts, the larger cache when in doubt.
            kv = int(getattr(text, "num_key_value_heads", 0) or
                     getattr(text, "num_attention_heads", 0) or 0)
        kind = types[i] if i < len(types) else None
        sliding = kind == "sliding_attention" or bool(getattr(attn, "is_sliding", False))
        window = getattr(text, "sliding_window", None) if sliding else None
        chunked = kind == "chunked_attention"
        if chunked:
            # Llama 4's RoPE layers attend within chunks of attention_chunk_size tokens; vLLM
            # caches them as ChunkedLocalAttentionSpec, which holds at most one chunk (plus the
            # tokens in flight) a request, as a sliding window of that many tokens does
            window = getattr(text, "attention_chunk_size", None)
        out.append(LayerAttention(kv, head_dim, int(window) if window else None, shared,
                                  chunked=chunked and bool(window)))
    return tuple(out)


def shape(cfg: Mapping[str, Any]) -> HfShape | None:
    """The model of ``cfg`` (a parsed config.json) as transformers builds it, or None.

    Importing torch and transformers and building the model take some 3 s, most of a
    `launcher plan`; so a shape once counted is kept on disk (see :func:`_cache_file`) and the
    next plan of the same model reads it back without importing either."""
    import json

    try:
        # without the quantization: the shape is counted as bf16 whatever it says (_shape), so
        # the checkpoints of one model in several quantizations share one count
        key = json.dumps({k: v for k, v in cfg.items() if k != "quantization_config"},
                         sort_keys=True, default=str)
    except (TypeError, ValueError):
        return None
    path = _cache_file(key)
    cached = _read_cached(path) if path is not None else None
    if cached is not None:
        return cached
    found = _shape(key)
    if found is not None and path is not None:
        _write_cached(path, found)
    return found


def _cache_file(key: str) -> Path | None:
    """Where the shape of config ``key`` is kept: named by a hash of the config, the installed
    transformers and this module's own source, so that a new transformers or a change of the
    counting here never reads an old answer. None where nothing can be kept."""
    import hashlib
    import os

    from launcher.model.tinymodel import default_cache_dir

    version = _transformers_version()
    if version is None:
        return None
    source = _source_digest()
    if source is None:
        return None
    digest = hashlib.sha256(b"\0".join([key.encode(), version.encode(), source])).hexdigest()
    return default_cache_dir(os.environ) / "shapes" / f"{digest[:32]}.json"


@lru_cache(maxsize=1)
def _transformers_version() -> str | None:
    """The installed transformers' version (it keys the cache, see _cache_file), looked up once
    per process: importlib.metadata scans every installed distribution for it, some 3 ms, as
    long as a whole plan's search of a small topology's layouts read from the cache."""
    from importlib import metadata

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def _source_digest() -> bytes | None:
    """This module's source, hashed once per process (it keys the cache, see _cache_file)."""
    import hashlib

    try:
        return hashlib.sha256(Path(__file__).read_bytes()).digest()
    except OSError:
        return None


def _to_json(found: HfShape) -> dict[str, Any]:
    return dataclasses.asdict(found)


def _from_json(data: Any) -> HfShape:
    """The shape a cache file holds; TypeError/KeyError/ValueError when it holds anything else."""
    fields = dict(data)
    fields["attention"] = tuple(LayerAttention(**a) for a in fields["attention"])
    fields["linear_modules"] = tuple((str(name), n) for name, n in fields["linear_modules"])
    found = HfShape(**fields)
    ints = (found.embedding_params, found.lm_head_params, found.linear_params,
            found.expert_params, found.other_params, found.rope_cache_elems,
            found.tower_params, *(n for _, n in found.linear_modules))
    if not all(type(n) is int for n in ints) or not isinstance(found.text, dict):
        raise TypeError("not a shape")
    return found


def _read_cached(path: Path) -> HfShape | None:
    from topocommon import jsontext

    try:
        return _from_json(jsontext.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # absent, unreadable or not ours: count the model again


def _write_cached(path: Path, found: HfShape) -> None:
    import json
    import os
    import tempfile

    try:
        text = json.dumps(_to_json(found))
        if _from_json(json.loads(text)) != found:
            return  # a field JSON cannot carry as it is: not kept rather than kept changed
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".shape-")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)  # whole or not at all, for a plan running beside this one
    except (OSError, TypeError, ValueError):
        return  # a read-only cache only costs the next plan its 3 s
