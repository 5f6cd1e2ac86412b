"""Model sizing from ``config.json``: parameters, weight bytes, KV-cache bytes per token.

Reads a local directory (or a config.json path), or a Hugging Face hub model through
:mod:`launcher.model.hub` (which fetches only the small JSON files, or reads them from its cache).
Multimodal configs that nest the language model under ``text_config`` (Gemma 3, Mistral 3) are
read from there; a vision tower's parameters are added to the weights.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launcher.errors import ModelError
from launcher.model import families, hfconfig, hub, quantization
from launcher.model.mla import MlaDims
from launcher.model.mla import dims as mla_dims
from topocommon import jsontext
from topocommon.hub import is_repo_id

GIB = 1024**3
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 2, "float": 2, "fp8": 1}
# float32 checkpoints are served in 16 bits by vLLM's dtype=auto, so they cost 2 bytes too.

@dataclass(frozen=True)
class KvGroup:
    """Layers that hold KV cache of one shape: full attention, a sliding window of ``window``
    tokens, or (``chunked``) attention within chunks of ``window`` tokens."""

    layers: int
    kv_heads: int
    head_dim: int
    # Tokens a local layer keeps and attends over at most; None for full attention. A sliding
    # layer attends over the last ``window`` tokens; a chunked one (Llama 4's RoPE layers,
    # vLLM's ChunkedLocalAttentionSpec) over its own chunk of ``window`` tokens only, so it
    # keeps one chunk's KV (the cap on the cache), but a query reads only its chunk's prefix
    # so far (:meth:`keys`), between 1 and ``window`` keys.
    window: int | None = None
    latent: bool = False  # MLA: one latent vector per token (no separate K and V)
    chunked: bool = False  # ``window`` is the chunk of chunked attention, not a sliding window

    def bytes_per_token(self, kv_dtype_bytes: int = 2) -> int:
        return (1 if self.latent else 2) * self.kv_heads * self.head_dim * kv_dtype_bytes

    def _pairs_before(self, n: int) -> int:
        """Keys the queries at positions 0 … n-1 read in all (:meth:`pairs` from 0)."""
        n = max(0, n)
        w = self.window
        if not w:  # full attention (MLA's too): position p reads p + 1 keys
            return n * (n + 1) // 2
        if self.chunked:  # p reads its chunk's keys up to itself: p mod w + 1
            whole, rest = divmod(n, w)
            return whole * (w * (w + 1) // 2) + rest * (rest + 1) // 2
        if n <= w:  # sliding: min(p + 1, w)
            return n * (n + 1) // 2
        return w * (w + 1) // 2 + (n - w) * w

    def pairs(self, start: int, end: int) -> int:
        """The (query, key) pairs of the queries at positions ``start`` … ``end`` - 1 (0-based;
        a prompt chunk after ``start`` cached tokens, or a decoder's one new token), each
        attending to itself and the earlier keys its kind lets it see: every one (full), the
        last ``window`` (sliding), or those of its own ``window``-token chunk (chunked, as
        vLLM's ChunkedLocalAttention masks them). THE rule of which keys a layer reads, which
        every step's attention is costed by (launcher.planner.costmodel)."""
        if end <= start:
            return 0
        return self._pairs_before(end) - self._pairs_before(start)

    def keys(self, position: int) -> int:
        """Keys the query at ``position`` (0-based) reads: a decode step's, per sequence."""
        return self.pairs(position, position + 1)

    def keys_read(self, start: int, end: int) -> int:
        """The distinct cached keys the queries at ``start`` … ``end`` - 1 read together (a
        step's KV read, once): all ``end`` of them (full); a sliding layer's last ``window``
        (min(end, window): a prompt chunk is charged one window, as before the chunked kind was
        told apart); a chunked layer's from the start of ``start``'s chunk."""
        if end <= start:
            return 0
        w = self.window
        if not w:
            return end
        if self.chunked:
            return end - start // w * w
        return min(end, w)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: str
    family: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int
    params: int  # every weight, vision tower included
    active_params: int  # weights one token passes through (differs for mixture-of-experts)
    weight_bytes: int
    dtype: str  # activation / KV dtype vLLM will use
    quantization: str | None  # 'awq' | 'gptq' | 'fp8' | 'bitsandbytes' | ... | None
    weight_bits: float  # bits per parameter of the quantized linear layers (16 if none)
    sliding_window: int | None = None
    # layers that attend only over the last ``sliding_window`` tokens (chunked-attention layers
    # are not among them: see chunked_layers)
    sliding_layers: int = 0
    num_experts: int = 0
    tied_embeddings: bool = True  # the LM head reuses the input embedding table
    path: str | None = None
    experts_per_token: int = 0  # top-k of a mixture-of-experts router
    moe_intermediate_size: int = 0
    # A mixture of experts' MLP beyond the routed experts, as vLLM's model classes run it: the
    # shared experts' width (one dense MLP every MoE layer runs for every token, DeepSeek's
    # n_shared_experts x moe_intermediate_size, Qwen2-MoE's shared_expert_intermediate_size)
    # and the decoder layers that run a plain dense MLP of ``intermediate_size`` instead of the
    # experts (DeepSeek's first_k_dense_replace / moe_layer_freq, Qwen-MoE's mlp_only_layers /
    # decoder_sparse_step). Zero for a dense model.
    shared_expert_intermediate_size: int = 0
    dense_mlp_layers: int = 0
    # Layers with their own KV cache, by shape; empty means num_layers × (kv_heads, head_dim),
    # ``sliding_layers`` of them windowed. Gemma 4 differs per layer type and shares KV layers.
    layer_kv: tuple[KvGroup, ...] = ()
    rope_cache_elems: int = 0  # vLLM's rotary tables (elements); 0: positions × head_dim
    # latent attention's own sizes (kv/q LoRA ranks, nope/rope/v head dims): the operations
    # vLLM runs for it (launcher.model.mla); None for every other attention
    mla: MlaDims | None = None
    # config.json names its own modelling code (auto_map) for a model_type the installed
    # transformers does not define: vLLM loads it only with --trust-remote-code
    custom_code: bool = False
    # the input embedding tables (per-layer input embeddings too): a row read per token, never
    # multiplied; with a tied LM head the head's table too (``lm_head_params`` counts its use)
    embedding_params: int = 0
    # vision/audio towers and their projectors (part of ``params``): vLLM runs them on a
    # request's images or audio, never on a text token, so no step's matmuls pass through them
    tower_params: int = 0
    # A hybrid model's recurrent layers (Mamba, gated delta-net) and the bytes of state they
    # keep for one sequence, whatever its length (:func:`_recurrent_state_bytes`): part of what
    # a sequence holds in vLLM's KV-cache pool beside its attention layers' blocks
    recurrent_layers: int = 0
    recurrent_state_bytes: int = 0
    # Of ``weight_bytes``, what vLLM holds beyond the checkpoint's own bytes once it has
    # repacked the 4-bit layers for its kernel (quantization.awq_load_growth): kept apart so
    # that a checkpoint's real size (sized_by_checkpoint) is raised by it too. Of that, the
    # part Hopper's Machete alone holds (16-bit zero points; Marlin keeps them packed):
    # ``weight_bytes`` is Hopper's, the larger; weight_bytes_on gives another card's.
    load_growth_bytes: int = 0
    machete_zero_bytes: int = 0
    # Why part of the checkpoint's quantization config was read otherwise than vLLM reads it,
    # and what was assumed instead (quantization.modelopt_unquantized): one line each
    notes: tuple[str, ...] = ()
    # Bytes per KV element the checkpoint's quantization config asks vLLM's --kv-cache-dtype
    # auto for (quantization.kv_cache_quantized: 1, an FP8 cache); None: none asked, or none
    # sized. Whether the served vLLM takes it is its release's rule (families.vllm_auto_kv_bytes)
    kv_cache_quantized: int | None = None

    @property
    def lm_head_params(self) -> int:
        """The LM head's matmul (hidden -> vocabulary), tied to the embedding or not: vLLM runs
        it only for the positions that sample (its ``logits_indices``: one per running sequence
        that samples in a step; a chunk of a prompt that is not its last samples nothing)."""
        return self.vocab_size * self.hidden_size

    @property
    def token_params(self) -> int:
        """Weights every token's matmuls pass through: the active weights less the embedding
        tables (a lookup), an untied LM head (run per sampled position: lm_head_params) and the
        towers (run per image or audio clip, not per token)."""
        head = 0 if self.tied_embeddings else self.lm_head_params
        return max(0, self.active_params - self.embedding_params - head - self.tower_params)

    @property
    def kv_groups(self) -> tuple[KvGroup, ...]:
        if self.layer_kv:
            return self.layer_kv
        full = KvGroup(self.full_layers, self.num_kv_heads, self.head_dim)
        if not self.sliding_layers:
            return (full,)
        return (
            full,
            KvGroup(self.sliding_layers, self.num_kv_heads, self.head_dim, self.sliding_window),
        )

    @property
    def full_layers(self) -> int:
        return self.num_layers - self.sliding_layers

    @property
    def chunked_layers(self) -> int:
        """Layers of chunked attention (Llama 4's), each attending within its own chunk."""
        return sum(g.layers for g in self.kv_groups if g.chunked)

    @property
    def attention_chunk(self) -> int | None:
        """The chunk (tokens) of the chunked-attention layers; None where there are none."""
        return next((g.window for g in self.kv_groups if g.chunked), None)

    def kv_bytes_per_layer_token(self, kv_dtype_bytes: int = 2) -> int:
        latent = next((g for g in self.layer_kv if g.latent), None)
        if latent is not None:  # MLA: the compressed vector, not per-head K and V
            return latent.bytes_per_token(kv_dtype_bytes)
        return 2 * self.num_kv_heads * self.head_dim * kv_dtype_bytes  # K and V

    def kv_bytes(self, tokens: int, kv_dtype_bytes: int = 2) -> int:
        """KV cache of one sequence of ``tokens`` tokens; sliding layers keep only their window;
        a hybrid model's recurrent layers their state, the same at any length."""
        return self.recurrent_state_bytes + sum(
            g.layers * g.bytes_per_token(kv_dtype_bytes) * min(tokens, g.window or tokens)
            for g in self.kv_groups
        )

    def kv_bytes_per_token(self, context: int | None = None, kv_dtype_bytes: int = 2) -> float:
        """Average KV bytes per token of a sequence ``context`` long (default: the full context)."""
        n = context or self.max_position_embeddings
        return self.kv_bytes(n, kv_dtype_bytes) / n

    def tokens_fitting(self, kv_budget_bytes: float, kv_dtype_bytes: int = 2) -> int:
        """The longest single sequence whose KV cache fits in ``kv_budget_bytes``."""
        if kv_budget_bytes <= 0 or self.kv_bytes(1, kv_dtype_bytes) == 0:
            return 0
        lo, hi = 0, 1 << 30
        while lo < hi:  # kv_bytes grows with the length: bisect
            mid = (lo + hi + 1) // 2
            if self.kv_bytes(mid, kv_dtype_bytes) <= kv_budget_bytes:
                lo = mid
            else:
                hi = mid - 1
        return lo


# ------------------------------------------------------------------------------------ parsing


def _text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, Mapping):
            return sub
    return cfg


# Far past any published model (DeepSeek-V3: 61 layers, hidden 7168, 256 experts; Llama 4:
# 202,048 tokens of vocabulary, 10M of context). A value past these is a damaged config, and
# building it (even on the meta device) would take the planner minutes or all its memory.
_SIZE_LIMITS = {
    "num_hidden_layers": 4096, "hidden_size": 1 << 17, "intermediate_size": 1 << 21,
    "moe_intermediate_size": 1 << 21, "num_attention_heads": 4096, "num_key_value_heads": 4096,
    "head_dim": 1 << 14, "vocab_size": 1 << 23, "num_experts": 1 << 13,
    "num_local_experts": 1 << 13, "n_routed_experts": 1 << 13, "kv_lora_rank": 1 << 16,
    "max_position_embeddings": 1 << 30,
}


def _beyond_any_model(t: Mapping[str, Any]) -> str | None:
    for key, limit in _SIZE_LIMITS.items():
        value = t.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > limit:
            return f"{key} = {value}, beyond any model (at most {limit:,})"
    return None


def _vision_params(cfg: Mapping[str, Any]) -> int:
    """A ViT tower: per layer attention (4·h²) and MLP (2·h·i); embeddings are small beside them."""
    v = cfg.get("vision_config")
    if not isinstance(v, Mapping):
        return 0
    h, inter, n = (
        v.get("hidden_size", 0),
        v.get("intermediate_size", 0),
        v.get("num_hidden_layers", 0),
    )
    return int(n * (4 * h * h + 2 * h * inter))


def _sliding_layers(t: Mapping[str, Any], model_type: str, layers: int) -> tuple[int | None, int]:
    window = t.get("sliding_window")
    types = t.get("layer_types")
    if isinstance(types, list) and types:
        n = sum(1 for x in types if x == "sliding_attention")
        return (window, n) if window and n else (None, 0)
    if not window:
        return None, 0
    family = families.of_model_type(model_type)
    if family is not None and family.local_layers is not None:
        return window, family.local_layers(t, layers)
    if t.get("use_sliding_window") is False:  # Qwen2 configs carry a window they do not use
        return None, 0
    return window, layers


def _width(value: Any) -> int:
    """An MLP width: one number, or one per layer (Gemma 3n) read as their mean."""
    if isinstance(value, list):
        widths = [int(v) for v in value]
        return sum(widths) // len(widths)
    return int(value)


def _count_params(
    t: Mapping[str, Any], layers: int, heads: int, kv: int, head_dim: int
) -> tuple[int, int, int, int]:
    """(embedding params, per-layer attention, per-layer MLP, per-layer MLP a token passes)."""
    h, vocab = int(t["hidden_size"]), int(t["vocab_size"])
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q, o and k, v
    if t.get("attention_bias") or families.has_qkv_bias(str(t.get("model_type", ""))):
        attn += (heads + 2 * kv) * head_dim  # q/k/v biases
    experts = int(
        t.get("num_experts") or t.get("num_local_experts") or t.get("n_routed_experts") or 0
    )
    if experts:
        inter = _width(t.get("moe_intermediate_size") or t["intermediate_size"])
        per_tok = int(t.get("num_experts_per_tok") or 2)
        shared = int(t.get("shared_expert_intermediate_size") or 0)
        mlp = 3 * h * inter * experts + 3 * h * shared + h * experts
        active = 3 * h * inter * per_tok + 3 * h * shared + h * experts
    else:
        mlp = active = 3 * h * _width(t["intermediate_size"])  # gate, up, down
    embed = vocab * h * (1 if t.get("tie_word_embeddings", True) else 2)
    return embed, attn + 2 * h, mlp, active


def _moe_mlps(t: Mapping[str, Any], layers: int, experts: int) -> tuple[int, int]:
    """(shared experts' intermediate width, decoder layers with a dense MLP) of a mixture of
    experts, from the config fields vLLM's model classes read (deepseek_v2.py: a layer is MoE
    when its index is at least first_k_dense_replace and a multiple of moe_layer_freq;
    qwen2_moe.py / qwen3_moe.py: when it is not in mlp_only_layers and (index + 1) is a multiple
    of decoder_sparse_step); (0, 0) for a dense model. A malformed field counts as absent."""
    if not experts:
        return 0, 0

    def count(key: str) -> int:
        try:
            return max(0, int(t.get(key) or 0))
        except (TypeError, ValueError, OverflowError):
            return 0

    # (_experts has read moe_intermediate_size already: a malformed one never reaches here)
    per_expert = _width(t.get("moe_intermediate_size") or 0)
    shared = count("shared_expert_intermediate_size") or count("n_shared_experts") * per_expert
    first = count("first_k_dense_replace")
    freq, step = count("moe_layer_freq") or 1, count("decoder_sparse_step") or 1
    only = t.get("mlp_only_layers")
    mlp_only = {i for i in only if isinstance(i, int)} if isinstance(only, list) else set()
    dense = sum(1 for i in range(layers)
                if i < first or i % freq or i in mlp_only or (i + 1) % step)
    return shared, min(dense, layers)


def _experts(t: Mapping[str, Any]) -> tuple[int, int, int]:
    """(routed experts, experts per token, expert intermediate size); zeros for a dense model."""
    e = int(t.get("num_experts") or t.get("num_local_experts") or t.get("n_routed_experts") or 0)
    if not e or t.get("enable_moe_block") is False:
        return 0, 0, 0
    k = int(t.get("num_experts_per_tok") or t.get("top_k_experts") or 2)
    return e, k, _width(t.get("moe_intermediate_size") or t.get("intermediate_size") or 0)


def _latent_groups(t: Mapping[str, Any], layers: int) -> tuple[KvGroup, ...]:
    """MLA's cache from the config's own fields, when transformers cannot build the model."""
    rank = t.get("kv_lora_rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        return ()
    rope = t.get("qk_rope_head_dim")
    rope = rope if isinstance(rope, int) and not isinstance(rope, bool) and rope > 0 else 0
    return (KvGroup(layers, 1, rank + rope, None, latent=True),)


def _kv_groups(attn: tuple[hfconfig.LayerAttention, ...]) -> tuple[KvGroup, ...]:
    """Layers with their own KV cache, grouped by shape (shared-KV layers hold none)."""
    counts: dict[tuple[int, int, int | None, bool, bool], int] = {}
    for a in attn:
        if not a.shared:
            key = (a.kv_heads, a.head_dim, a.window, a.latent, a.chunked)
            counts[key] = counts.get(key, 0) + 1
    return tuple(KvGroup(n, kv, d, w, lat, chunked)
                 for (kv, d, w, lat, chunked), n in counts.items())


def spec_from_config(cfg: Mapping[str, Any], name: str, path: str | None = None) -> ModelSpec:
    """Size a model from its parsed config.json; ModelError (one line) on a config this cannot
    read: a field missing, of another type or out of range, wherever it is used."""
    try:
        spec = _spec_from_config(cfg, name, path)
    except ModelError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError,
            OverflowError, IndexError) as exc:
        raise ModelError(f"{name}: config.json has a value this planner cannot read "
                         f"({_one_line(exc)}); is it a decoder-only language model?") from exc
    problem = _implausible(spec)
    if problem:
        raise ModelError(f"{name}: config.json gives {problem}; is it a decoder-only "
                         "language model with a valid config?")
    return spec


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


def _is_count(value: object, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _implausible(m: ModelSpec) -> str | None:
    """What makes the sized model unusable to plan with (a config's value of the wrong type
    that got through), or None."""
    for field, low in (("num_layers", 1), ("hidden_size", 1), ("num_heads", 1),
                       ("num_kv_heads", 0), ("head_dim", 1), ("vocab_size", 1),
                       ("max_position_embeddings", 1), ("params", 1), ("active_params", 0),
                       ("weight_bytes", 1), ("sliding_layers", 0), ("num_experts", 0),
                       ("experts_per_token", 0), ("intermediate_size", 0)):
        value = getattr(m, field)
        if not _is_count(value, low):
            return f"{field} = {value!r}"
    if m.num_experts and m.experts_per_token > m.num_experts:
        return (f"{m.experts_per_token} experts per token of {m.num_experts} "
                "(num_experts_per_tok above the experts there are)")
    if m.sliding_window is not None and not _is_count(m.sliding_window, 1):
        return f"sliding_window = {m.sliding_window!r}"
    for g in m.kv_groups:
        if not (_is_count(g.layers) and _is_count(g.kv_heads) and _is_count(g.head_dim, 1)
                and (g.window is None or _is_count(g.window, 1))):
            return f"a KV cache layout of {g}"
    if m.kv_bytes(1) <= 0:
        return "no KV cache per token"
    return None


@dataclass(frozen=True)
class _Dims:
    """The shape fields every config gives, and (for a config transformers could not build)
    the parameters counted from them."""

    layers: int
    heads: int
    kv: int
    hidden: int
    head_dim: int
    embed: int
    attn: int
    mlp: int
    active_mlp: int


@dataclass(frozen=True)
class _Split:
    """Parameters by how they are stored and used, and the KV cache's layer groups."""

    linear: int  # quantizable linear layers
    other: int  # embeddings, LM head, norms, towers: 16-bit
    inactive: float  # routed experts a token does not pass
    groups: tuple[KvGroup, ...]
    window: int | None
    sliding: int


def _text_fields(cfg: Mapping[str, Any], hf: hfconfig.HfShape | None) -> tuple[dict[str, Any], str]:
    """The language model's fields (a multimodal config's text_config) and its model_type."""
    t = dict(hf.text) if hf else dict(_text_config(cfg))
    # tie_word_embeddings sits at the top level in multimodal configs
    t.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", True))
    if not hf and cfg.get("tie_word_embeddings") is not None and "text_config" in cfg:
        t["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    return t, str(t.get("model_type") or cfg.get("model_type") or "unknown")


def _dims(t: dict[str, Any], model_type: str, counted: bool, name: str) -> _Dims:
    """The shape of ``t`` (its vocabulary defaulted from the family), or one ModelError line."""
    try:
        layers = int(t["num_hidden_layers"])
        heads = int(t["num_attention_heads"])
        kv = int(t.get("num_key_value_heads") or heads)
        hidden = int(t["hidden_size"])
        if min(layers, heads, kv, hidden) <= 0:
            raise ValueError("layers, heads, KV heads and hidden size must be positive")
        t["vocab_size"] = t.get("vocab_size") or _family(model_type).default_vocab
        head_dim = int(t.get("head_dim") or hidden // heads)
        # transformers counted the model where it could build it; else the fields are counted
        embed, attn, mlp, active_mlp = (0, 0, 0, 0) if counted else _count_params(
            t, layers, heads, kv, head_dim)
    except KeyError as exc:
        raise ModelError(
            f"{name}: config.json lacks {exc}, needed to size the model; is it a decoder-only "
            "language model?"
        ) from exc
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise ModelError(
            f"{name}: config.json has a value this planner cannot read or out of range "
            f"({_one_line(exc)}); is it a decoder-only language model?"
        ) from exc
    return _Dims(layers, heads, kv, hidden, head_dim, embed, attn, mlp, active_mlp)


def _split(cfg: Mapping[str, Any], t: Mapping[str, Any], hf: hfconfig.HfShape | None,
           d: _Dims, model_type: str, n_experts: int, per_token: int) -> _Split:
    if hf:
        groups = _kv_groups(hf.attention)
        return _Split(
            linear=hf.linear_params,
            other=hf.embedding_params + hf.lm_head_params + hf.other_params,
            inactive=hf.expert_params * (1 - per_token / n_experts) if n_experts else 0.0,
            groups=groups,
            window=next((g.window for g in groups if g.window and not g.chunked), None),
            sliding=sum(g.layers for g in groups if g.window and not g.chunked),
        )
    window, sliding = _sliding_layers(t, model_type, d.layers)
    return _Split(
        linear=d.layers * (d.attn - 2 * d.hidden + d.mlp),
        other=d.embed + d.layers * 2 * d.hidden + d.hidden + _vision_params(cfg),
        inactive=float(d.layers * (d.mlp - d.active_mlp)),
        groups=_latent_groups(t, d.layers),
        window=window,
        sliding=sliding,
    )


def _weight_bytes(sp: _Split, hf: hfconfig.HfShape | None, d: _Dims,
                  bits: float, overhead: float, dense_bytes: int, n_experts: int,
                  per_token: int, experts_only: bool, unquantized: int = 0) -> int:
    """The weights' bytes: the quantizable linear layers packed, less ``unquantized`` of
    them (a ModelOpt checkpoint's excluded modules), the rest at ``dense_bytes``."""
    packed = max(0, sp.linear - unquantized)
    if experts_only:  # the experts only; attention, router, embeddings stay 16-bit
        experts = hf.expert_params if hf else max(0, int(d.layers * (d.mlp - d.active_mlp) /
                                                       max(1e-9, 1 - per_token / n_experts))
                                                   if n_experts else 0)
        packed = min(packed, experts)
    return int(packed * (bits / 8 + overhead) + (sp.linear - packed) * dense_bytes
               + sp.other * dense_bytes)


def _field_modules(d: _Dims, n_experts: int, linear: int) -> tuple[tuple[str, int], ...]:
    """The linear layers of a model transformers could not build, by the names a Llama-shaped
    checkpoint gives them (an exclusion list is matched against names): each layer's q/k/v/o
    projections from its heads, and its MLP as gate/up/down thirds or one experts module;
    whatever the heads leave of the attention's count (biases) goes to q_proj. Their sum is
    ``linear``, the count the weights are sized from."""
    kv = d.kv * d.head_dim * d.hidden
    attn = max(0, d.attn - 2 * d.hidden)
    o = min(attn, d.heads * d.head_dim * d.hidden)
    k = min(kv, (attn - o) // 2)
    out: list[tuple[str, int]] = []
    for i in range(d.layers):
        at = f"model.layers.{i}"
        out += [(f"{at}.self_attn.q_proj", attn - o - 2 * k), (f"{at}.self_attn.k_proj", k),
                (f"{at}.self_attn.v_proj", k), (f"{at}.self_attn.o_proj", o)]
        out += ([(f"{at}.mlp.experts", d.mlp)] if n_experts else
                [(f"{at}.mlp.gate_proj", d.mlp // 3), (f"{at}.mlp.up_proj", d.mlp // 3),
                 (f"{at}.mlp.down_proj", d.mlp - 2 * (d.mlp // 3))])
    counted = sum(n for _, n in out)
    return tuple(out) if counted == linear else (*out, ("model.layers", linear - counted))


def _unquantized(cfg: Mapping[str, Any], t: Mapping[str, Any], hf: hfconfig.HfShape | None,
                 d: _Dims, n_experts: int, linear: int) -> tuple[int, tuple[str, ...]]:
    """(linear parameters a ModelOpt checkpoint leaves at 16 bits, notes): its exclusion list
    (quantization.modelopt_unquantized) against the model's linear modules, transformers'
    where it built the model, else named from the fields (:func:`_field_modules`). The LM
    head, embeddings and towers are not among them: they are sized at 16 bits already."""
    exclusions = quantization.modelopt_unquantized(cfg, t)
    if exclusions is None:
        return 0, ()
    if exclusions.every:
        return linear, exclusions.notes
    if not exclusions.patterns:
        return 0, exclusions.notes
    modules = hf.linear_modules if hf and hf.linear_modules else _field_modules(d, n_experts,
                                                                                 linear)
    return min(linear, quantization.unquantized_params(exclusions, modules)), exclusions.notes


def _dense_matrices(d: _Dims, intermediate: int, linear: int) -> dict[tuple[int, int], int]:
    """A dense decoder's linear layers as vLLM fuses them ((input, output features): how many):
    QKV, the attention's output, gate-up and down, once a layer; empty unless they count the
    model's ``linear`` parameters exactly (a mixture of experts, latent attention, a recurrent
    layer or a family with other projections is not this shape, and is not guessed at)."""
    qkv = (d.heads + 2 * d.kv) * d.head_dim
    out: dict[tuple[int, int], int] = {}
    for shape in ((d.hidden, qkv), (d.heads * d.head_dim, d.hidden),
                  (d.hidden, 2 * intermediate), (intermediate, d.hidden)):
        out[shape] = out.get(shape, 0) + d.layers
    counted = sum(k * n * count for (k, n), count in out.items())
    return out if intermediate > 0 and counted == linear else {}


def _load_growth(cfg: Mapping[str, Any], t: Mapping[str, Any], d: _Dims,
                 linear: int) -> quantization.LoadGrowth:
    """The bytes vLLM holds beyond the checkpoint's for its AWQ layers (see
    quantization.awq_load_growth); none for any other checkpoint."""
    zeros = quantization.zero_point_groups(cfg, t)
    if zeros is None:
        return quantization.LoadGrowth(0, 0)
    return quantization.awq_load_growth(
        _dense_matrices(d, _width(t.get("intermediate_size") or 0), linear), *zeros)


def weight_bytes_on(m: ModelSpec, cc: tuple[int, int] | None) -> int:
    """The weights vLLM holds of ``m`` on a card of compute capability ``cc``: ``weight_bytes``
    (Hopper's layout) less Machete's 16-bit zero points where vLLM runs Marlin, which keeps
    them packed as the checkpoint does (quantization.mixed_input_gemm). A card whose compute
    capability is not known (None) is sized at Hopper's layout, the larger: a memory fit must
    not count on bytes the card may hold after all (the kernel's timing assumes Marlin, the
    slower, for the same reason)."""
    if cc is None or quantization.mixed_input_gemm(cc).kernel == "machete":
        return m.weight_bytes
    return m.weight_bytes - m.machete_zero_bytes


def _spec_from_config(cfg: Mapping[str, Any], name: str, path: str | None = None) -> ModelSpec:
    """spec_from_config's reading, which may raise on a value of the wrong type.

    The config is read through transformers' class for its model_type and the model counted
    module by module (:mod:`launcher.model.hfconfig`); a config transformers cannot build is sized
    from its own fields (the family's defaults for the few it commonly omits)."""
    beyond = _beyond_any_model(_text_config(cfg))
    if beyond:
        raise ModelError(f"{name}: config.json gives {beyond}; is the config damaged?")
    hf = hfconfig.shape(cfg)
    t, model_type = _text_fields(cfg, hf)
    if hf is None:
        _check_own_code_sizes(cfg, t, model_type, name)
    d = _dims(t, model_type, hf is not None, name)
    dtype = str(
        cfg.get("torch_dtype")
        or t.get("torch_dtype")
        or cfg.get("dtype")
        or t.get("dtype")
        or "bfloat16"
    )
    method, bits, overhead = quantization.read(cfg, t)
    n_experts, per_token, moe_inter = _experts(t)
    if hf and not hf.expert_params and not _experts(_text_config(cfg))[0]:
        # an expert count only the config class's default gives (NemotronHConfig's 8 for the
        # dense Nemotron-H-56B), of a model whose modules hold no experts: not a mixture
        n_experts, per_token, moe_inter = 0, 0, 0
    moe_mlps = _moe_mlps(t, d.layers, n_experts)
    sp = _split(cfg, t, hf, d, model_type, n_experts, per_token)
    # MLA: one latent "head", the same on every TP rank: vLLM replicates it
    kv = 1 if any(g.latent for g in sp.groups) else d.kv
    params = sp.linear + sp.other
    growth = (quantization.LoadGrowth(0, 0) if n_experts
              else _load_growth(cfg, t, d, sp.linear))
    unquantized, notes = _unquantized(cfg, t, hf, d, n_experts, sp.linear)
    kv_quantized, kv_notes = quantization.kv_cache_quantized(cfg, t)
    arch = (cfg.get("architectures") or [model_type])[0]
    return ModelSpec(
        name=name,
        architecture=str(arch),
        family=families.family_name(model_type, str(cfg.get("model_type") or "") or None),
        model_type=model_type,
        num_layers=d.layers,
        hidden_size=d.hidden,
        num_heads=d.heads,
        num_kv_heads=kv,
        head_dim=d.head_dim,
        vocab_size=int(t["vocab_size"]),
        intermediate_size=_width(t.get("intermediate_size") or 0),
        max_position_embeddings=int(
            t.get("max_position_embeddings")
            or cfg.get("max_position_embeddings")
            or _family(model_type).default_context or 4096
        ),
        params=params,
        active_params=int(params - sp.inactive),
        weight_bytes=_weight_bytes(sp, hf, d, bits, overhead,
                                   _DTYPE_BYTES.get(dtype, 2), n_experts, per_token,
                                   quantization.experts_only(cfg, t),
                                   unquantized) + growth.total,
        dtype="float16"
        if method in ("awq", "gptq")
        else ("bfloat16" if dtype in ("float32", "float") else dtype),
        quantization=method,
        weight_bits=bits,
        sliding_window=sp.window,
        sliding_layers=sp.sliding,
        num_experts=n_experts,
        tied_embeddings=bool(t.get("tie_word_embeddings", True)),
        path=path,
        experts_per_token=per_token,
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=moe_mlps[0],
        dense_mlp_layers=moe_mlps[1],
        layer_kv=sp.groups,
        rope_cache_elems=hf.rope_cache_elems if hf else 0,
        mla=mla_dims(t) if any(g.latent for g in sp.groups) else None,
        custom_code=hf is None and isinstance(cfg.get("auto_map"), Mapping)
        and bool(cfg.get("auto_map")),
        embedding_params=hf.embedding_params if hf else int(t["vocab_size"]) * d.hidden,
        tower_params=hf.tower_params if hf else _vision_params(cfg),
        recurrent_layers=hf.recurrent_layers if hf else 0,
        recurrent_state_bytes=_recurrent_state_bytes(hf, t, model_type),
        load_growth_bytes=growth.total,
        machete_zero_bytes=growth.machete_zeros,
        notes=(*notes, *kv_notes),
        kv_cache_quantized=kv_quantized,
    )


# vLLM keeps a recurrent layer's state in pages of its KV-cache pool, and with prefix caching on
# (every plan turns it on) in mamba_cache_mode "align": a running request holds two pages a
# layer, the state it runs on and the one it last settled (vllm/v1/kv_cache_interface.py,
# MambaSpec.max_memory_usage_bytes: 2 + speculative + checkpoint blocks, both 0 by default).
ALIGN_STATE_PAGES = 2
_STATE_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _recurrent_state_bytes(hf: hfconfig.HfShape | None, t: Mapping[str, Any],
                           model_type: str) -> int:
    """The bytes one sequence's recurrent state takes (see ALIGN_STATE_PAGES): the convolution's
    state in the model's 16 bits, the recurrence's in the dtype vLLM picks for the family under
    mamba_ssm_cache_dtype 'auto' (families.ssm_state_dtype: Nemotron-H's config value or
    float32, Qwen3.5's mamba_ssm_dtype), else 16 bits too."""
    if hf is None or not hf.recurrent_layers:
        return 0
    state = _STATE_DTYPE_BYTES.get(families.ssm_state_dtype(model_type, t) or "", 2)
    return ALIGN_STATE_PAGES * (2 * hf.recurrent_conv_elems + state * hf.recurrent_state_elems)


def _check_own_code_sizes(cfg: Mapping[str, Any], t: Mapping[str, Any], model_type: str,
                          name: str) -> None:
    """One ModelError line where a model_type the installed transformers does not define, whose
    own code (auto_map) builds it, leaves a size the planner needs null in config.json for that
    code to work out (Nemotron-NAS, DeciLM's Llama-3.3-Nemotron-Super: KV heads and MLP widths
    per layer, in block_configs): no count from the fields would be the model's."""
    if not (isinstance(cfg.get("auto_map"), Mapping) and cfg.get("auto_map")):
        return
    left = [k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                        "num_key_value_heads", "intermediate_size") if k in t and t[k] is None]
    if left:
        raise ModelError(
            f"{name}: model_type {model_type!r} is defined by the model's own code (auto_map), "
            f"which the planner does not run, and config.json leaves {', '.join(left)} to that "
            "code (null), so it cannot be sized from config.json alone; serve it with vLLM "
            "directly (vllm serve MODEL --trust-remote-code), whose start-up check sizes it")


def _family(model_type: str) -> families.Family:
    """The family's row (launcher.model.families); an unknown type has no rules."""
    return families.of_model_type(model_type) or families.Family(model_type, (model_type,))


# ---------------------------------------------------------------------------------- locating
# (a local folder or config.json here; a hub id through launcher.model.hub, online or from its
# cache)


def find_config(ref: str, env: Mapping[str, str], revision: str | None = None) -> Path:
    """config.json of a directory, a config.json path, or a hub id (``org/name``) fetched with
    huggingface_hub (from its cache when offline)."""
    p = Path(ref).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        if (p / "config.json").is_file():
            return p / "config.json"
        if any(p.glob("*.gguf")):
            raise ModelError(f"{ref} holds GGUF files (llama.cpp's format) and no config.json: "
                             f"{hub.GGUF_ADVICE}")
        raise ModelError(
            f"{ref} is a directory without config.json; point --model at the model's folder"
        )
    if not is_repo_id(ref):
        raise ModelError(
            f"model {ref!r} not found: not a local folder or config.json, and not a Hugging Face "
            "model id (org/name)"
        )
    return hub.fetch(ref, revision, env).files[hub.CONFIG]


def load_model_spec(
    ref: str, env: Mapping[str, str] | None = None, revision: str | None = None
) -> ModelSpec:
    """Size the model ``ref`` (local path or hub id, at ``revision`` for a hub id) from its
    config.json, and from its safetensors index where there is one."""
    env = os.environ if env is None else env
    if revision is not None and Path(ref).expanduser().exists():
        raise ModelError(f"--revision is for a hub model (org/name); {ref} is a local path")
    cfg_path = find_config(ref, env, revision)
    try:
        cfg = jsontext.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(_not_a_config(cfg_path, exc)) from exc
    if not isinstance(cfg, dict):
        raise ModelError(f"{cfg_path} is not a JSON object")
    cfg = with_side_quant_config(cfg, cfg_path.parent / hub.QUANT_CONFIG)
    local = Path(ref).expanduser()
    name = (local.parent if local.is_file() else local).resolve().name if local.exists() else ref
    spec = spec_from_config(cfg, name=name, path=str(cfg_path.parent))
    total = hub.checkpoint_bytes(cfg_path.parent / hub.INDEX)
    if total is None:  # a one-file checkpoint has no index; its header says as much
        total = hub.single_file_bytes(cfg_path.parent / "model.safetensors")
    return sized_by_checkpoint(spec, cfg, total)


def with_side_quant_config(cfg: dict[str, Any], path: Path) -> dict[str, Any]:
    """``cfg`` with the quantization of ``path`` (hf_quant_config.json) where config.json names
    none: ModelOpt before 0.31 saved it there alone, and vLLM reads it from there (its
    transformers_utils/config.py does the same), so an FP8 or NVFP4 checkpoint is not sized
    at 16 bits. A file that is absent or not a JSON object changes nothing."""
    text = cfg.get("text_config")
    if cfg.get("quantization_config") or (isinstance(text, Mapping)
                                          and text.get("quantization_config")):
        return cfg
    try:
        side = jsontext.loads(path.read_text())
    except (OSError, ValueError):
        return cfg
    return {**cfg, "quantization_config": side} if isinstance(side, dict) and side else cfg


def _not_a_config(path: Path, exc: Exception) -> str:
    """Why ``path`` is no config.json, with what to pass instead where the file says what it is
    (a checkpoint passed by its weights file: a GGUF of llama.cpp, or a safetensors shard)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(16)
    except OSError:
        head = b""
    if head.startswith(b"GGUF"):
        return f"{path} is a GGUF file (llama.cpp's format): {hub.GGUF_ADVICE}"
    if path.suffix in (".safetensors", ".bin", ".pt", ".pth"):
        return f"{path} is a weights file; pass the model's folder (the one with config.json)"
    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"cannot read {path} as a model's config.json: {why}"


def sized_by_checkpoint(spec: ModelSpec, cfg: Mapping[str, Any], total: int | None) -> ModelSpec:
    """The spec with the checkpoint's real size (safetensors index ``total_size``) in place of
    the estimate from config.json, which misses what the formulas do not know of.

    Quantized checkpoints load as stored: their weight bytes are the checkpoint's, and what
    vLLM's repacking adds to them (``load_growth_bytes``). Others are
    served at the spec's bytes per parameter (a float32 checkpoint in 16 bits), so the index
    gives the parameter count: bytes / the checkpoint's bytes per parameter.
    """
    if total is None or spec.params <= 0:
        return spec
    if total * 8 < spec.params:
        # Less than one bit per weight config.json counts cannot hold the weights in any format:
        # a damaged index (or a header-only file), read as no index rather than a 0-byte model.
        return spec
    if spec.quantization is not None:
        return replace(spec, weight_bytes=total + spec.load_growth_bytes)
    served = spec.weight_bytes / spec.params
    nested = cfg.get("text_config")
    text: Mapping[str, Any] = nested if isinstance(nested, dict) else {}
    stored_dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or text.get("torch_dtype") or "")
    stored = 4.0 if stored_dtype in ("float32", "float") else served
    params = round(total / stored)
    dense = spec.active_params == spec.params
    return replace(
        spec,
        params=params,
        active_params=params if dense else min(spec.active_params, params),
        weight_bytes=round(params * served),
    )
