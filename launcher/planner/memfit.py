"""Memory fit: what vLLM holds on each GPU, the KV cache left, and the context it will accept. Pure.

vLLM sizes its KV cache at start-up (vllm/v1/worker/gpu_worker.py ``determine_available_memory``):

    KV memory = gpu_memory_utilization × total memory
                − weights − peak activations of one profiling forward pass
                − memory outside torch that grew meanwhile (cuBLAS, NCCL) − CUDA-graph estimate

vLLM 0.26 logs each term on the H200 ("Actual usage is W GiB for weight, A GiB for peak
activation, N GiB for non-torch memory"); every term below is modelled from its mechanism and
checked against those logs (tests/launcher/test_kv_context.py, docs/planner.md).

The profiling pass runs ``max_num_batched_tokens`` tokens (vLLM's default depends on the GPU:
8,192 for the OpenAI server on a card of ≥ 70 GiB that is not an A100, 16,384 from 160 GiB,
2,048 below; vllm/engine/arg_utils.py) and a sampler over ``max_num_seqs`` rows of logits. It
then refuses to start when one request of ``max_model_len`` tokens does not fit in that
memory less the one block its pool holds back (vllm/v1/core/kv_cache_utils.py
``get_kv_cache_configs``, :func:`null_block_bytes`), where a sliding-window
layer holds ``window − 1 + max_num_batched_tokens`` tokens, not just its window. A hybrid
model's recurrent (Mamba, linear-attention) layers hold their state pages per request whatever
its length, and its attention blocks are enlarged to hold one (:func:`state_block_tokens`).

Everything here is an estimate of those figures, so the context the planner sets keeps a margin
below the longest one the estimate admits (:func:`kept_back`): ``CONTEXT_MARGIN`` of the KV
budget, never more than the bytes of the estimate's own absolute terms (:func:`context_cushion`).

How many requests run at once is this module's too: the KV pool's blocks (``pool_blocks``, kept
on the ``Fit``) over the blocks one request takes (``request_blocks``), as vLLM counts its
"maximum concurrency" (``sequences_held``). The cost model batches that many; it sizes no
memory of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from launcher.model import families
from launcher.model.modelspec import (
    ALIGN_STATE_PAGES,
    GIB,
    KvGroup,
    ModelSpec,
    weight_bytes_on,
)
from launcher.planner.cudagraphs import VLLM_DEFAULT, CudaGraphs, Requested
from launcher.probe.topology import Gpu

# Kept below the longest context the estimate admits (:func:`kept_back`). The terms below are
# each at or a little above what vLLM 0.26 logged for the models they were checked on, so the
# margin covers what varies between two starts of the same engine and what the terms miss, both
# bytes of the absolute terms, not of the KV budget: the Qwen2.5-32B shape at 0.9 logged a peak
# activation of 1.53 and 1.59 GiB on two starts (0.06 GiB), the MoE's fused-MoE buffers 0.03
# GiB above the model; over every start logged in benchmarks/gpu/results the estimate was at
# most 0.61 GiB above vLLM's "Available KV cache memory" (the Llama-3.3-70B AWQ shape at 0.5,
# its weights 0.81 GiB above memfit's), 28% of its activation, graph and non-torch terms; the
# latent-attention MoEs' profiling peaks, 0.09-0.15 GiB above memfit's, put their estimates up
# to 0.22 GiB above vLLM's (Moonlight at 0.3 with graphs to 64 tokens). 2% keeps the plan within
# 5% of vLLM's longest context at 0.15; the terms' bytes bound it at large budgets.
CONTEXT_MARGIN = 0.02
BLOCK_TOKENS = 16  # vLLM's GPU block size (the CPU backend uses 128)
# Memory outside torch's allocator that grows during vLLM's profile (cuBLAS and cuBLASLt
# workspaces, the attention backend's buffers): 0.22-0.24 GiB in every one-GPU start vLLM 0.26
# logged on the H200. Under TP or PP the NCCL warm-up creates them before vLLM's baseline
# snapshot, and 0.06-0.07 GiB is left (70B TP2 and PP2, 32B TP2).
NON_TORCH_BYTES = 0.25 * GIB
PARALLEL_NON_TORCH_BYTES = 0.1 * GIB
# Under TP the custom all-reduce's buffers are allocated while the model loads and count in
# vLLM's "weights": the Qwen2.5-32B shape at TP2 over NVLink loaded 29.30 GiB for 29.11 of
# weights and rotary tables (the 70B at TP2 with the custom all-reduce off: 63.85 for 63.84).
TP_BUFFER_BYTES = 0.2 * GIB
# vLLM 0.26's "sampled" CUDA-graph estimate (families.vllm_graph_estimate), taken from the KV
# budget where its V1 model runner serves the model (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by
# default). gpu_model_runner.py ``profile_cudagraph_memory`` captures the two largest sizes of
# each mode (PIECEWISE, FULL) in a pool of its own, takes the first capture's memory for the
# first graph and the second's for each further one: max(first) + (n_piecewise - 1 + n_full - 1)
# x per graph. The first capture (the largest size's activations, at most 512 tokens) costs
# about one graph more, so the estimate is per graph x (graphs - 1), a graph's memory set by its
# layers (the piecewise pieces, a FULL graph's kernel nodes). FITTED per layer and graph to the
# six logged V1 starts (three models, two capture lists each; vLLM 0.26 on the H200 and H100),
# a latent-attention (MLA) layer apart from another: Qwen3-30B-A3B's 48 layers 0.09 GiB for 7 +
# 7 sizes to 64 (0.148 MiB a layer and graph) and 0.64 for 51 + 51 to 512 (0.132);
# Moonlight-16B-A3B's 27 MLA layers 0.15 and 0.89 GiB (0.438, 0.334); GLM-4.7-Flash's 47 MLA
# layers 0.21 and 1.84 GiB (0.352, 0.397). Rounded up to the larger figure under vLLM's default
# sizes, so the estimate is at or above vLLM's there: 0.68, 1.07 and 1.85 GiB.
CUDAGRAPH_LAYER_BYTES = int(0.15 * 1024**2)
MLA_CUDAGRAPH_LAYER_BYTES = int(0.4 * 1024**2)
# vLLM 0.32's V2 runner ("captured") runs the real capture into a throwaway pool, every
# PIECEWISE graph measured and the FULL ones extrapolated from the two largest: its estimate is
# what capturing the graphs takes, as 0.26's V2 runner logged it after start-up ("Graph
# capturing finished in N secs, took X GiB", the same ``capture_model``) and its V1 runner's
# real captures did, ~25% above their sampled estimates. FITTED per layer and graph (over the
# graphs less one, as above) to those logged captures, vLLM 0.26 on the H200 and H100
# (benchmarks/gpu/results/*/logs), rounded up to the largest under vLLM's default sizes (51 + 51
# graphs to 512 tokens): dense layers 0.175-0.314 MiB (Qwen2.5-3B 0.62 GiB over 36 layers,
# Gemma-3-1B 0.46 over 26 ... Qwen3-8B 1.01 over 36, Qwen3-32B-AWQ 1.98 over 64, Llama-3.3-70B
# AWQ 2.11 over 80); the one GQA mixture of experts, Qwen3-30B-A3B, 0.171 (0.81 GiB; 0.197 with
# 7 + 7 sizes to 64); MLA layers 0.402-0.466 (Moonlight 1.07 GiB over 27, DeepSeek-V2-Lite 1.18
# over 27, GLM-4.7-Flash 2.16 over 47). Dense layers with 7 + 7 sizes came out at 0.25-0.46 MiB
# (SmolLM2's 24 layers 0.14 GiB): at most 0.05 GiB above these figures, within the margin.
# Not measured on 0.32 itself (no GPU for its CUDA build here).
CAPTURED_LAYER_BYTES = int(0.32 * 1024**2)
CAPTURED_MOE_LAYER_BYTES = int(0.2 * 1024**2)
CAPTURED_MLA_LAYER_BYTES = int(0.47 * 1024**2)
# A model vLLM 0.26 serves on its V2 runner has no CUDA-graph estimate taken from its budget
# (the graphs, 0.5-0.9 GiB under the default sizes, are captured after the KV cache, beyond
# it), yet memfit keeps 2 MiB a layer of the stage for it, as it did for every model: the
# dense starts' weights load up to 0.15 GiB above memfit's (Gemma 3 27B 48.16 GiB for 48.01;
# the AWQ 70B 0.81 above) and this covers the first, and without it the AWQ 70B's plan at 0.5
# is 0.2% above vLLM's longest context (111,104 tokens for 110,864). Not vLLM's figure: a
# cushion until those weights are explained. Where an estimate is taken (0.32 for every model)
# the captured figures, rounded up to the largest model's, cover it instead.
V2_RUNNER_LAYER_BYTES = 2 * 1024**2
# What the profiling pass holds at its peak beyond the layer's own tensors (persistent input,
# position and metadata buffers sized for the batched-token budget, the compiled graph's
# workspaces): 0.09-0.17 GiB above the MLP's tensors in the dense one-GPU and TP starts logged
# (8B, 32B, 32B TP2, 70B TP2, Gemma 3 27B).
ACTIVATION_FIXED_BYTES = 0.2 * GIB


@dataclass(frozen=True)
class EngineLimits:
    """vLLM's scheduler limits that size its profiling pass."""

    batched_tokens: int
    max_num_seqs: int


def vllm_defaults(gpu_memory_bytes: int, name: str) -> EngineLimits:
    """vLLM's defaults for the OpenAI server on this card (vllm/engine/arg_utils.py)."""
    if gpu_memory_bytes >= 160 * GIB:
        return EngineLimits(16384, 1024)
    if gpu_memory_bytes >= 70 * GIB and "a100" not in name.lower():
        return EngineLimits(8192, 1024)
    return EngineLimits(2048, 256)


# ---------------------------------------------------------------------------------- weights


def embedding_bytes(m: ModelSpec) -> int:
    """One vocab × hidden table in 16 bits (quantization leaves embeddings and LM head alone)."""
    return m.vocab_size * m.hidden_size * 2


def tower_bytes(m: ModelSpec) -> int:
    """The vision/audio towers: kept in 16 bits whatever the checkpoint's quantization, and
    read only when a request carries an image or a clip, never by a text step."""
    return m.tower_params * 2


def table_bytes(m: ModelSpec) -> int:
    """The input embedding and, when untied, the LM head."""
    return embedding_bytes(m) * (1 if m.tied_embeddings else 2)


def stage_share(m: ModelSpec, pp: int) -> float:
    """Fraction of the layers on the fullest pipeline stage (vLLM splits 62 layers 21/21/20)."""
    return -(-m.num_layers // pp) / m.num_layers


def rope_cache_bytes(m: ModelSpec) -> int:
    """vLLM's rotary cos/sin tables (one per distinct rotary setting, a row per position, in the
    model's dtype) on every GPU. They count in "Model loading took": the Llama-3.1-8B shape
    with 1,048,576 positions loaded 13.31 GiB on the H200 for 13.06 GiB of weights, the
    0.25 GiB this gives."""
    return (m.rope_cache_elems or m.max_position_embeddings * m.head_dim) * 2


def held_weight_bytes(m: ModelSpec, gpus: Sequence[Gpu] = ()) -> int:
    """The weights vLLM holds of ``m`` on ``gpus``: the largest any of them holds
    (:func:`weight_bytes_on`: a 4-bit AWQ model's 16-bit zero points on Hopper alone, so an
    RTX 3090's plan does not give up context for them; a card of unknown compute capability
    at the larger layout). With no card given, an unknown card's."""
    return max((weight_bytes_on(m, g.cc) for g in gpus), default=weight_bytes_on(m, None))


def weights_per_gpu(m: ModelSpec, tp: int, pp: int, gpus: Sequence[Gpu] = ()) -> float:
    # PP splits the layers evenly and gives the embedding to the first stage, the LM head to
    # the last (a copy of the embedding when they are tied); TP splits the tables by vocabulary.
    tables = table_bytes(m)
    per_stage = embedding_bytes(m) if pp > 1 else tables
    layers = (held_weight_bytes(m, gpus) - tables) * stage_share(m, pp) / tp
    return layers + per_stage / tp + rope_cache_bytes(m)


def kv_shards(m: ModelSpec, tp: int, pp: int) -> float:
    """Into how many parts the KV cache divides: KV heads over TP (replicated past the head
    count), layers over PP (the fullest stage sets the size)."""
    return min(tp, m.num_kv_heads) / stage_share(m, pp)


# ------------------------------------------------------------------------------ activations


def activation_bytes(m: ModelSpec, tp: int, lim: EngineLimits, pp: int = 1) -> float:
    """Peak of vLLM's profiling run: one forward pass of ``batched_tokens`` tokens, then the
    sampler over ``max_num_seqs`` rows; they run one after the other, so the larger counts.

    The forward pass peaks inside the MLP (or attention, where that is wider), holding the
    residual and the layer's input beside the MLP's tensors, all in bf16; with PP a later stage
    also keeps the hidden states it received. Against vLLM 0.26's logged peaks: 8B 1.0 GiB
    (0.93), 32B 1.64 (1.53-1.59), 32B TP2 1.0 (0.92), 70B TP2 1.1 (1.0), 70B PP2 1.89
    (1.72-1.78), Gemma 3 27B 1.35 (1.3), Qwen3-30B-A3B 1.04 (0.87)."""
    t, h = lim.batched_tokens, m.hidden_size
    # attention: the fused QKV output and the attention output beside it
    attention = (m.num_heads * 2 + 2 * m.num_kv_heads) * m.head_dim / tp
    if m.num_experts:
        k = max(1, m.experts_per_token)
        inter = m.moe_intermediate_size or m.intermediate_size
        # vLLM 0.26's fused MoE: per routed token a workspace of the wider of gate+up and the
        # hidden size, and one of the activation, plus the summed output. The workspace grows
        # in steps and a freed step stays pinned by later small allocations (vLLM 0.32 stops
        # that with a split limit in determine_available_memory), so it counts twice.
        mlp = k * (2 * max(2 * inter / tp, h) + inter / tp) + h
    else:
        mlp = 3 * m.intermediate_size / tp  # gate+up output and the activation
    received = h if pp > 1 else 0  # the previous stage's hidden states
    forward = t * (2 * h + max(mlp, attention) + received) * 2
    if m.mla is not None:
        forward = max(forward, mla_attention_peak(m, tp, lim) + t * received * 2)
    sampler = lim.max_num_seqs * m.vocab_size * 4 * 2  # fp32 logits and their softmax
    return max(forward, sampler) + ACTIVATION_FIXED_BYTES


# The most context tokens vLLM's latent attention up-projects at once when a prompt continues
# a cached one (mla_attention.py ``determine_chunked_prefill_workspace_size``: eight requests of
# max_model_len or four pages a request, at most 64 Ki tokens).
MLA_CONTEXT_CHUNK_TOKENS = 64 * 1024


def mla_attention_peak(m: ModelSpec, tp: int, lim: EngineLimits) -> float:
    """What a latent-attention layer holds at its peak in vLLM's profiling pass: with no
    attention metadata there, vLLM's MLA attention allocates the up-projection of a whole
    context chunk (chunk tokens × heads × (nope + v head dims), the largest its chunked-context
    prefill makes) to profile it, beside the pass's own tensors at that point: the residual and
    the layer's input, the fused latent/query-LoRA projection (views keep it whole), the normed
    latent, the decompressed query and the output. The chunk is vLLM's from max_model_len, here
    the model's own limit (the plan's context is at most that: the chunk can only be smaller).
    GLM-4.7-Flash (20 heads of 192 + 256 dims, chunk 64 Ki tokens): 1.09 GiB of chunk and 0.25 of
    tensors, 1.54 GiB with the fixed term, where vLLM 0.26 logged a peak of 1.63 GiB (the MoE
    path's 0.76 before); Moonlight's and DeepSeek-V2-Lite's 0.66 GiB stays under their MoE's."""
    d = m.mla
    assert d is not None
    heads = m.num_heads / tp
    chunk = min(max(8 * m.max_position_embeddings, 4 * lim.max_num_seqs * BLOCK_TOKENS),
                MLA_CONTEXT_CHUNK_TOKENS)
    chunk = -(-chunk // BLOCK_TOKENS) * BLOCK_TOKENS
    up_projection = chunk * heads * (d.qk_nope_head_dim + d.v_head_dim) * 2
    per_token = (2 * m.hidden_size + d.q_lora_rank + d.latent_dim + d.kv_lora_rank
                 + heads * (d.qk_head_dim + d.v_head_dim))
    return up_projection + lim.batched_tokens * per_token * 2


def graph_estimate(m: ModelSpec, release: families.Release | None) -> families.GraphEstimate:
    """How vLLM ``release`` (None: not known) sizes the CUDA-graph memory it takes from this
    model's KV budget (families.vllm_graph_estimate, by the model's kind)."""
    return families.vllm_graph_estimate(release, m.architecture, moe=m.num_experts > 0,
                                        hybrid=0 < m.recurrent_layers < m.num_layers,
                                        attention_free=m.recurrent_layers >= m.num_layers)


def graphs_profiled(m: ModelSpec,
                    release: families.Release | None = families.LOGGED_RELEASE) -> bool:
    """Whether vLLM ``release`` takes a CUDA-graph estimate from this model's KV budget: on 0.26
    where its V1 model runner serves it (families.vllm_v1_runner; the V2 runner captures its
    graphs after sizing the KV cache, outside the budget: its dense starts logged 0.5-0.9 GiB
    of graphs and an "Available KV cache memory" that leaves none out); on 0.32 always."""
    return graph_estimate(m, release) != "none"


def graph_count(graphs: CudaGraphs, lim: EngineLimits) -> int:
    """The CUDA graphs vLLM captures under FULL_AND_PIECEWISE: a piecewise graph of every size,
    a full one of each size up to ``max_num_seqs`` decoders (vllm/v1/cudagraph_dispatcher.py:
    a full graph runs one token a request)."""
    return len(graphs.sizes) + sum(1 for n in graphs.sizes if n <= lim.max_num_seqs)


def cudagraph_bytes(m: ModelSpec, pp: int, graphs: CudaGraphs, lim: EngineLimits) -> float:
    """vLLM's CUDA-graph estimate on the fullest stage, as the served release (``graphs.vllm``)
    takes it from the KV budget (:func:`graph_estimate`): per graph and layer × the graphs less
    one (the first's cost is the first capture's), the sampled figures
    (:data:`CUDAGRAPH_LAYER_BYTES`) or the captured ones (:data:`CAPTURED_LAYER_BYTES`); where it
    takes none, the cushion :data:`V2_RUNNER_LAYER_BYTES` instead."""
    rule = graph_estimate(m, graphs.vllm)
    if rule == "none":
        return V2_RUNNER_LAYER_BYTES * m.num_layers * stage_share(m, pp)
    n = graph_count(graphs, lim)
    if not n:
        return 0.0
    if rule == "sampled":
        per_layer = MLA_CUDAGRAPH_LAYER_BYTES if m.mla is not None else CUDAGRAPH_LAYER_BYTES
    elif m.mla is not None:
        per_layer = CAPTURED_MLA_LAYER_BYTES
    else:
        per_layer = CAPTURED_MOE_LAYER_BYTES if m.num_experts else CAPTURED_LAYER_BYTES
    return per_layer * (n - 1) * m.num_layers * stage_share(m, pp)


def default_graphs(gpus: Sequence[Gpu], lim: EngineLimits) -> CudaGraphs:
    """The graphs vLLM captures with no flags on these GPUs under its default limits."""
    return Requested(None, lim.max_num_seqs, lim.batched_tokens).on(g.cc for g in gpus)


def overhead_per_gpu(m: ModelSpec, tp: int, pp: int, lim: EngineLimits,
                     graphs: CudaGraphs = VLLM_DEFAULT) -> float:
    """Everything vLLM takes from the budget besides weights and KV cache."""
    non_torch = PARALLEL_NON_TORCH_BYTES if tp * pp > 1 else NON_TORCH_BYTES
    buffers = TP_BUFFER_BYTES if tp > 1 else 0.0
    return (non_torch + buffers + activation_bytes(m, tp, lim, pp)
            + cudagraph_bytes(m, pp, graphs, lim))


# ------------------------------------------------------------------------------ KV and context


# vLLM's GPU engine schedules the next step while one runs (async scheduling): two batches are
# in flight, and a sliding-window layer keeps KV for both (VllmConfig.max_in_flight_tokens).
GPU_BATCHES_IN_FLIGHT = 2
CPU_BATCHES_IN_FLIGHT = 1


def vllm_groups(m: ModelSpec) -> list[tuple[KvGroup, int]]:
    """The attention KV groups vLLM forms, each with how many layers it counts (padding included).

    With one page size for every layer type, vLLM makes groups of as many layers as the
    smallest type has (the largest, when they differ by less than 1.5×) and pads each type's
    last group (kv_cache_utils.py ``_get_kv_cache_groups_uniform_page_size``): Gemma 3's 52
    sliding layers are counted as 60 beside its 10 full ones. A hybrid model's recurrent layers
    are one more type of that page size (:func:`state_block_tokens`), counted in the group size
    but kept apart (:func:`recurrent_group_layers`). Types of different page sizes are counted
    layer by layer here (no padding)."""
    return _vllm_grouping(m)[1]


def vllm_group_count(m: ModelSpec) -> int:
    """How many KV-cache groups vLLM forms for ``m`` (:func:`vllm_groups`' padded layers over
    the layers a group holds, and a hybrid's recurrent groups): 1 for a model of one attention
    type, 7 for Gemma-3-1B (1 full group of 4 layers, 6 sliding-window groups of 4: 22 padded
    to 24), 2 for Gemma 2, 4 for Qwen3-Next (12 attention layers, 36 linear-attention ones in 3
    groups of 12). Each is one block table the engine keeps and updates for every running
    request every step (hardware.HostProfile.kv_group_seq_step_s). Types of different page
    sizes are counted a group each (no padding), as :func:`vllm_groups` counts them."""
    size, groups = _vllm_grouping(m)
    state = recurrent_group_layers(m)
    counted = sum(layers // size if size else 1 for _, layers in groups)
    return max(1, counted + (state // size if size else 0))


def _type_layers(m: ModelSpec) -> tuple[list[KvGroup], list[int]]:
    """The attention types with layers, and every type's layer count, a hybrid's recurrent
    layers last."""
    groups = [g for g in m.kv_groups if g.layers]
    return groups, [g.layers for g in groups] + ([m.recurrent_layers] if _hybrid(m) else [])


def _hybrid(m: ModelSpec) -> bool:
    return bool(m.recurrent_layers and m.recurrent_state_bytes)


def _vllm_grouping(m: ModelSpec) -> tuple[int, list[tuple[KvGroup, int]]]:
    """How many layers each of vLLM's KV groups holds, and :func:`vllm_groups`' types with their
    padded layer counts. The size is 0 where each type is one group of its own (one type, or
    types of different page sizes). A hybrid's recurrent pages are padded to its attention page
    (:func:`state_block_tokens`), so they share one page size whenever its attention does."""
    groups, sizes = _type_layers(m)
    size = 0
    if len(sizes) > 1 and len({g.bytes_per_token() for g in groups}) == 1:
        size = _layers_per_group(sizes)
    padded = [-(-n // size) * size if size else n for n in sizes]
    return size, list(zip(groups, padded[: len(groups)], strict=True))


def _layers_per_group(sizes: list[int]) -> int:
    """The layers each KV group holds when layer types of ``sizes`` layers share one page size:
    the smallest type's count, or the largest's where they differ by less than 1.5×
    (kv_cache_utils.py ``_get_kv_cache_groups_uniform_page_size``)."""
    return max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)


def recurrent_group_layers(m: ModelSpec) -> int:
    """A hybrid model's recurrent layers as vLLM groups them, padding included (0 for none)."""
    if not _hybrid(m):
        return 0
    size, _ = _vllm_grouping(m)
    return -(-m.recurrent_layers // size) * size if size else m.recurrent_layers


def tp_share(m: ModelSpec, tp: int) -> ModelSpec:
    """``m`` with the recurrent state one KV replica holds at TP ``tp``, in the units the rest of
    this module counts a replica in (one GPU's KV × :func:`kv_shards`): vLLM divides a hybrid's
    state over every TP rank (MambaStateShapeCalculator: the heads and the convolution's
    channels) but its attention KV heads only over as many ranks as there are heads, the rest
    holding copies. Past the KV heads the state takes a smaller share of an attention page, and
    the block vLLM raises to hold it (:func:`state_block_tokens`, from the pages of one GPU:
    ``get_num_kv_heads`` and the state shape at that TP) shrinks: Qwen3-Next's 2 KV heads keep
    544-token blocks up to TP 2, 272 at TP 4. ``m`` itself where nothing changes."""
    shards = min(tp, m.num_kv_heads)
    if not _hybrid(m) or shards >= tp:
        return m
    page = state_page_bytes(m) // tp * shards
    return replace(m, recurrent_state_bytes=page * ALIGN_STATE_PAGES * m.recurrent_layers)


def state_page_bytes(m: ModelSpec) -> int:
    """One recurrent layer's state for one sequence, unpadded: vLLM's MambaSpec.page_size_bytes
    before padding (vllm/v1/kv_cache_interface.py); ModelSpec.recurrent_state_bytes holds
    ALIGN_STATE_PAGES of them a layer."""
    if not _hybrid(m):
        return 0
    return m.recurrent_state_bytes // (ALIGN_STATE_PAGES * m.recurrent_layers)


def state_block_tokens(m: ModelSpec, kv_dtype_bytes: int = 2, block: int = BLOCK_TOKENS) -> int:
    """The attention block size vLLM runs a hybrid model with: the smallest multiple of
    ``block`` whose attention page (one layer) holds a recurrent layer's state page
    (vllm/platforms/interface.py ``Platform._align_hybrid_block_size``, called from
    ``update_block_size_for_backend``: the attention block is raised to a multiple of the
    kernel's block size, 16 for FlashAttention, so that the page is at least the Mamba page,
    and the Mamba page is then padded to exactly that page). 544 tokens for Qwen3-Next's
    1.05 MiB state pages and 2 KiB attention tokens. ``block`` for a model with no state."""
    state = state_page_bytes(m)
    token = attention_token_bytes(m, kv_dtype_bytes)
    if not state or not token:
        return block
    return block * max(1, -(-state // (block * token)))


def attention_token_bytes(m: ModelSpec, kv_dtype_bytes: int = 2) -> int:
    """One token's KV bytes in one layer of the widest attention type (0 for none): the page a
    hybrid's attention block and its padded recurrent pages are sized by."""
    return max((g.bytes_per_token(kv_dtype_bytes) for g in m.kv_groups if g.layers), default=0)


def request_kv_bytes(
    m: ModelSpec,
    tokens: int,
    batched_tokens: int,
    kv_dtype_bytes: int = 2,
    block: int = BLOCK_TOKENS,
    in_flight: int = GPU_BATCHES_IN_FLIGHT,
) -> int:
    """What vLLM's start-up check reserves for one request of ``tokens``: whole blocks per layer
    of each (padded) group; a sliding-window layer holds ``window − 1 + in-flight tokens`` plus
    one block (chunked prefill frees blocks only once a step settles), never more than the
    request; a chunked-attention layer ``chunk + in-flight tokens``, block-aligned. Matches
    the H200's refusal of Gemma 3 27B at 131,072 tokens: 17.98 GiB needed.

    A hybrid model's attention layers count blocks of :func:`state_block_tokens`, and each of
    its (padded) recurrent layers ALIGN_STATE_PAGES pages of that block's attention page,
    whatever the length: the check sums each layer spec's ``max_memory_usage_bytes``
    (vllm/v1/core/kv_cache_utils.py ``check_enough_kv_cache_memory``), a MambaSpec's being
    ``page_size_bytes`` (padded) × (2 + speculative + checkpoint blocks) in align mode
    (vllm/v1/kv_cache_interface.py ``MambaSpec.max_memory_usage_bytes``)."""
    block = state_block_tokens(m, kv_dtype_bytes, block)
    widest = attention_token_bytes(m, kv_dtype_bytes)
    total = 0
    for g, layers in vllm_groups(m):
        # every page is the widest type's (unify_kv_cache_spec_page_size): a type of narrower
        # tokens gets a block as many times longer where that divides (Gemma 4's full layers,
        # 8 KiB a token beside 16: 32-token blocks), its page padded where not
        token = g.bytes_per_token(kv_dtype_bytes)
        own = block * (widest // token) if widest % token == 0 else block
        total += layers * layer_blocks(g, tokens, batched_tokens, own, in_flight) * block * widest
    state = recurrent_group_layers(m) * ALIGN_STATE_PAGES
    return total + state * block * widest


def layer_blocks(g: KvGroup, tokens: int, batched_tokens: int, block: int, in_flight: int) -> int:
    """The blocks one layer of group ``g`` holds for one request of ``tokens`` (see
    :func:`request_kv_bytes`)."""
    if g.window and g.chunked:
        # a chunked layer (vLLM's ChunkedLocalAttentionSpec.max_admission_blocks_per_request)
        # holds its chunk and the in-flight tokens from the chunk's start, block-aligned: no
        # window straddling a block boundary, so no extra block
        return -(-min(g.window + in_flight * batched_tokens, tokens) // block)
    if g.window:
        held = min(g.window - 1 + in_flight * batched_tokens, tokens)
        return -(-held // block) + 1
    return -(-tokens // block)


def longest_context(
    m: ModelSpec,
    kv_budget: float,
    batched_tokens: int,
    kv_dtype_bytes: int = 2,
    *,
    block: int = BLOCK_TOKENS,
    in_flight: int = GPU_BATCHES_IN_FLIGHT,
) -> int:
    """The longest ``max_model_len`` whose one request passes vLLM's start-up check, which
    keeps one pool block back for the null block (:func:`null_block_bytes`)."""
    room = kv_budget - null_block_bytes(m, kv_dtype_bytes, block)

    def fits(n: int) -> bool:
        return request_kv_bytes(m, n, batched_tokens, kv_dtype_bytes, block, in_flight) <= room

    hi = max(1, m.max_position_embeddings)
    # the need grows with the length: bisect, as vLLM's own estimate does
    return hi if fits(hi) else longest_passing(fits, hi)


def null_block_bytes(m: ModelSpec, kv_dtype_bytes: int = 2, block: int = BLOCK_TOKENS) -> int:
    """One block of vLLM's KV pool, which its block pool holds back for ever as the null
    block: the engine core subtracts it from the KV memory before it checks that one
    ``max_model_len`` request fits, and before it fits one to the memory
    (vllm/v1/core/kv_cache_utils.py ``get_kv_cache_configs``: ``check_memory``).

    A block spans one page of each layer of a group, and every page is the widest layer
    type's: vLLM pads a hybrid's state pages to its attention page, and raises the block of
    an attention type with smaller pages until its page is as wide
    (``unify_kv_cache_spec_page_size``), so layer types of different page sizes group like
    the rest (:func:`_vllm_grouping`'s group size from the layer counts). 10 pages of 4,128
    tokens for Nemotron-H-56B (0.16 GiB); 10 of Gemma-4-31B's 16 KiB-a-token pages, not one
    block of each of its 60 layers; one 16-token block of every layer for a dense model."""
    _, sizes = _type_layers(m)
    if not sizes:
        return 0
    span = _layers_per_group(sizes)  # a lone type's layers where there is one
    block = state_block_tokens(m, kv_dtype_bytes, block)
    return span * block * attention_token_bytes(m, kv_dtype_bytes)


# vLLM's switch for chunked local attention (Llama 4) under its hybrid KV-cache manager
# (vllm/envs.py). "1": each chunked layer keeps one chunk's blocks (ChunkedLocalAttentionSpec),
# as this module sizes them. "0": vLLM turns the manager off for the model (vllm/config/vllm.py,
# VllmConfig.__post_init__'s "latency regression" warning) and then gives every local layer
# full-attention blocks (vllm/v1/core/kv_cache_utils.py unify_hybrid_kv_cache_specs ->
# _promote_local_kv_cache_specs): the whole context's KV in all of them (:func:`local_kv_promoted`).
# Its default is "1" in vLLM 0.19.1 and 0.32 (both read in their source) and has been since
# vllm-project/vllm#29627 (merged 2025-12-16: attention metadata built once across the chunked
# layers' groups, the regression the "0" default of #21761 stood for), so in 0.26 as well;
# vllm-project/vllm#46553 asked for "0" again (a ROCm-only regression) and was closed. A plan
# pins it to "1" (:func:`hybrid_kv_pin`): its context, sized at one chunk a chunked layer, then
# holds whatever the serving shell or a later vLLM's default says.
HYBRID_KV_ENV = "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"


def hybrid_kv_allowed(env: Mapping[str, str]) -> bool:
    """Whether vLLM keeps its hybrid KV-cache manager for a chunked-attention model under
    ``env``: its own reading of :data:`HYBRID_KV_ENV` (``bool(int(value))``, "1" unset). A value
    ``int`` cannot read stops vLLM's start; taken as off, the larger cache."""
    try:
        return bool(int(env.get(HYBRID_KV_ENV, "1")))
    except ValueError:
        return False


def local_kv_promoted(m: ModelSpec) -> ModelSpec:
    """``m``'s KV cache as vLLM holds it with the hybrid KV-cache manager off: where the model
    has full-attention layers, every sliding-window and chunked layer holds full-attention
    blocks, the whole context (``_promote_local_kv_cache_specs``; the attention itself still
    reads only its window or chunk, so this is for sizing the cache, never for timing it), and
    layers of one shape are then one type, as vLLM groups them. ``m`` itself where every
    layer is local or none is."""
    groups = [g for g in m.kv_groups if g.layers]
    if not any(g.window for g in groups) or all(g.window for g in groups):
        return m
    merged: dict[tuple[int, int, bool], int] = {}
    for g in groups:
        key = (g.kv_heads, g.head_dim, g.latent)
        merged[key] = merged.get(key, 0) + g.layers
    full = tuple(KvGroup(n, heads, dim, latent=latent)
                 for (heads, dim, latent), n in merged.items())
    return replace(m, layer_kv=full, sliding_layers=0, sliding_window=None)


def kv_as_cached(m: ModelSpec, env: Mapping[str, str]) -> ModelSpec:
    """``m`` as vLLM's KV cache holds it under ``env``: a chunked-attention model's local layers
    at full attention unless :func:`hybrid_kv_allowed`; ``m`` itself otherwise."""
    if not m.chunked_layers or hybrid_kv_allowed(env):
        return m
    return local_kv_promoted(m)


def hybrid_kv_pin(m: ModelSpec, context: int) -> tuple[dict[str, str], list[str]]:
    """The environment a plan of ``m`` at ``context`` tokens gives vLLM so that its cache is
    the one sized here (:data:`HYBRID_KV_ENV` = 1 for a chunked-attention model; nothing for
    any other), with the reason line."""
    if not m.chunked_layers:
        return {}, []
    whole = local_kv_promoted(m).kv_bytes(context) / max(1, m.kv_bytes(context))
    return {HYBRID_KV_ENV: "1"}, [
        f"{HYBRID_KV_ENV}=1 (vLLM's default, pinned): the context is sized with the "
        f"{m.chunked_layers} chunked-attention layers keeping one {m.attention_chunk:,}-token "
        f"chunk of KV each (vLLM's hybrid KV-cache manager); with it 0 vLLM turns that manager "
        f"off and holds the whole context there too, {whole:.1f}x the KV of a {context:,}-token "
        "request"
    ]


def longest_passing(fits: Callable[[int], bool], hi: int) -> int:
    """The largest length in 0..``hi`` that ``fits`` (0 where none longer does), by bisection:
    ``fits`` holds up to some length and not past it."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def context_cushion(overhead: float, shards: float) -> float:
    """The most a replica's margin keeps back (:func:`kept_back`): ``overhead``, the bytes of
    the estimate's absolute terms besides the weights on each GPU (peak activation, memory
    outside torch, the CUDA-graph estimate, the TP buffers: :func:`overhead_per_gpu`, as the
    fit computed them), over the replica's ``shards`` (:func:`kv_shards`), as the KV budget is
    counted. They do not grow with the KV budget, and neither does what varies between two
    starts or what they miss (see CONTEXT_MARGIN)."""
    return overhead * shards


def kept_back(kv_budget: float, cushion: float) -> float:
    """The bytes of ``kv_budget`` the planned context leaves unused: ``CONTEXT_MARGIN`` of it,
    never more than ``cushion`` (:func:`context_cushion`; ``math.inf`` where no term is
    estimated, as on the CPU engine, whose cache is given outright: the fraction alone then
    covers memfit's block accounting against the CPU build's)."""
    return min(CONTEXT_MARGIN * kv_budget, cushion)


def usable_kv(kv_budget: float, cushion: float) -> float:
    """The part of ``kv_budget`` a plan fills: all of it but what :func:`kept_back` keeps."""
    return kv_budget - kept_back(kv_budget, cushion)


def budget_holding(kv: float, cushion: float) -> float:
    """The smallest KV budget whose :func:`usable_kv` is ``kv`` bytes (its inverse): the
    fraction's ``kv / (1 - CONTEXT_MARGIN)``, or ``kv + cushion`` where the cushion binds."""
    return min(kv / (1 - CONTEXT_MARGIN), kv + cushion)


def planned_context(
    m: ModelSpec,
    kv_budget: float,
    batched_tokens: int,
    kv_dtype_bytes: int = 2,
    *,
    cushion: float,
    block: int = BLOCK_TOKENS,
    in_flight: int = GPU_BATCHES_IN_FLIGHT,
) -> int:
    """The context to ask vLLM for: the model's own limit, or the longest one that fits in the
    estimated KV budget less its margin (:func:`kept_back`, at most ``cushion``)."""
    return longest_context(
        m,
        usable_kv(kv_budget, cushion),
        batched_tokens,
        kv_dtype_bytes,
        block=block,
        in_flight=in_flight,
    )


# vLLM's CPU backend: blocks of 128 tokens, one batch in flight, the OpenAI server's default of
# 2,048 batched tokens (vllm/platforms/cpu.py, vllm/engine/arg_utils.py).
CPU_BLOCK_TOKENS = 128
CPU_BATCHED_TOKENS = 2048


def cpu_context(
    m: ModelSpec, kv_cache_bytes: float, batched_tokens: int = CPU_BATCHED_TOKENS
) -> int:
    """The context to plan on the CPU engine, whose KV cache is given outright
    (VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes)."""
    return planned_context(m, kv_cache_bytes, batched_tokens, cushion=math.inf,
                           block=CPU_BLOCK_TOKENS, in_flight=CPU_BATCHES_IN_FLIGHT)


def cpu_kv_holding(m: ModelSpec, tokens: int, batched_tokens: int = CPU_BATCHED_TOKENS) -> float:
    """The smallest CPU KV cache whose :func:`cpu_context` is at least ``tokens`` (its inverse):
    one request of ``tokens`` as vLLM's start-up check counts it (a hybrid's recurrent state
    included, whatever the length) and the null block, with the margin kept."""
    kv = (request_kv_bytes(m, tokens, batched_tokens, block=CPU_BLOCK_TOKENS,
                           in_flight=CPU_BATCHES_IN_FLIGHT)
          + null_block_bytes(m, block=CPU_BLOCK_TOKENS))
    return budget_holding(kv, math.inf)


def cpu_engine_bytes(m: ModelSpec) -> float:
    """The CPU engine's own host memory besides its weights and KV cache: the peak of a forward
    pass of its batched tokens, or of the sampler over its 256 sequences (:func:`activation_bytes`
    at the CPU server's defaults)."""
    return activation_bytes(m, 1, EngineLimits(CPU_BATCHED_TOKENS, 256))


def pool_blocks(
    m: ModelSpec, kv_bytes: float, kv_dtype_bytes: int = 2, block: int = BLOCK_TOKENS
) -> int:
    """The blocks of vLLM's shared KV pool in ``kv_bytes``: with one page size for every layer
    type a block spans one layer of each (padded) group, ``num_blocks = kv_bytes // (block ×
    bytes per token and layer × group size)`` (kv_cache_utils.py
    ``get_kv_cache_config_from_groups``); with several page sizes, one block of every layer."""
    per, _, _ = _pool_block(m, kv_dtype_bytes, block)
    return int(kv_bytes // per) if per else 0


def _pool_block(
    m: ModelSpec, kv_dtype_bytes: int, block: int
) -> tuple[int, list[tuple[KvGroup, int]], int | None]:
    """One block of vLLM's pool: its bytes, :func:`vllm_groups`, and how many layers of each
    group a block spans (:func:`_vllm_grouping`'s size, a lone type's layers; None where the
    layer types' page sizes differ: then a block is one block of every layer, and a request's
    blocks are counted from its bytes). A hybrid's blocks are :func:`state_block_tokens` long,
    and its recurrent groups are groups of the same page size."""
    size, groups = _vllm_grouping(m)
    if not groups:
        return 0, groups, None
    block = state_block_tokens(m, kv_dtype_bytes, block)
    token = attention_token_bytes(m, kv_dtype_bytes)
    if not size and (len(groups) > 1 or _hybrid(m)):
        every = sum(n * block * g.bytes_per_token(kv_dtype_bytes) for g, n in groups)
        return every + recurrent_group_layers(m) * block * token, groups, None
    span = size or groups[0][1]
    return block * token * span, groups, span


def request_blocks(
    m: ModelSpec,
    tokens: int,
    batched_tokens: int,
    kv_dtype_bytes: int = 2,
    block: int = BLOCK_TOKENS,
    in_flight: int = GPU_BATCHES_IN_FLIGHT,
) -> int:
    """The blocks of :func:`pool_blocks`'s pool one request of ``tokens`` takes: whole blocks per
    group, a sliding-window group only its window's (:func:`layer_blocks`), a hybrid's
    recurrent group ALIGN_STATE_PAGES whatever the length (:func:`request_kv_bytes`)."""
    per, groups, size = _pool_block(m, kv_dtype_bytes, block)
    if not groups:
        return 0
    if size is None:
        need = request_kv_bytes(m, tokens, batched_tokens, kv_dtype_bytes, block, in_flight)
        return -(-need // per)
    block = state_block_tokens(m, kv_dtype_bytes, block)
    several = len(groups) > 1 or _hybrid(m)
    state = recurrent_group_layers(m) // size * ALIGN_STATE_PAGES if size else 0
    return state + sum((layers // size if several else 1)
                       * layer_blocks(g, tokens, batched_tokens, block, in_flight)
                       for g, layers in groups)


def scheduler_blocks(
    m: ModelSpec,
    kv_blocks: int,
    tokens: int,
    batched_tokens: int,
    kv_dtype_bytes: int = 2,
    block: int = BLOCK_TOKENS,
    in_flight: int = GPU_BATCHES_IN_FLIGHT,
) -> int:
    """The pool of :func:`pool_blocks` counted in the scheduler simulation's blocks, in which a
    request of ``tokens`` takes ⌈tokens / block⌉: a pool block spans one layer of each group, so
    with sliding-window groups one request takes fewer than its tokens' blocks
    (:func:`request_blocks`); the pool is scaled so that it holds as many such requests."""
    per = request_blocks(m, tokens, batched_tokens, kv_dtype_bytes, block, in_flight)
    plain = -(-tokens // block)
    return max(1, kv_blocks * plain // per if per else kv_blocks)


def kv_pool_tokens(
    m: ModelSpec,
    kv_bytes: float,
    max_model_len: int,
    batched_tokens: int,
    *,
    block: int = BLOCK_TOKENS,
    kv_dtype_bytes: int = 2,
    in_flight: int = GPU_BATCHES_IN_FLIGHT,
) -> int:
    """The token capacity vLLM logs ("KV cache size: N tokens") for ``kv_bytes`` of cache:
    ``num_blocks / blocks one max_model_len request takes × max_model_len``
    (kv_cache_utils.py ``get_kv_cache_capacity``)."""
    groups = vllm_groups(m)
    if not groups:
        return 0
    if len({g.bytes_per_token(kv_dtype_bytes) for g, _ in groups}) > 1:
        need = request_kv_bytes(m, max_model_len, batched_tokens, kv_dtype_bytes, block, in_flight)
        return int(kv_bytes / need * max_model_len) if need else 0
    per_request = request_blocks(m, max_model_len, batched_tokens, kv_dtype_bytes, block,
                                 in_flight)
    num_blocks = pool_blocks(m, kv_bytes, kv_dtype_bytes, block)
    return int(num_blocks / per_request * max_model_len)


# ------------------------------------------------------------------------------------ the fit


# vLLM starts a worker only if utilization × the GPU's memory is free once the worker's CUDA
# context (and NCCL's buffers, under TP) exist: about this much of each GPU goes to them first.
CONTEXT_RESERVE = 512 * 2**20


def _free_share(g: Gpu) -> float | None:
    """The share of ``g``'s memory a vLLM worker finds free at its start-up check, or None when
    what other processes hold was not read."""
    if not g.memory_used_bytes or g.memory_bytes <= 0:
        return None
    return (g.memory_bytes - g.memory_used_bytes - CONTEXT_RESERVE) / g.memory_bytes


def startable_utilization(gpus: Sequence[Gpu], asked: float) -> float:
    """The highest ``--gpu-memory-utilization`` up to ``asked`` that vLLM will start with on
    every one of ``gpus``, given the memory other processes held when they were read (a
    desktop, another engine), rounded down to 0.01; 0 when one of them has no room at all."""
    util = asked
    for g in gpus:
        free = _free_share(g)
        if free is not None:
            util = min(util, math.floor(free * 100) / 100)
    return max(util, 0.0)


@dataclass(frozen=True)
class Held:
    """Memory other processes hold on a GPU (a desktop, another engine), as NVML read it."""

    index: int
    used_bytes: int
    total_bytes: int

    def describe(self) -> str:
        return (f"GPU{self.index} {self.used_bytes / 2**30:.1f} of "
                f"{self.total_bytes / 2**30:.1f} GiB")


def held_by_others(gpus: Sequence[Gpu], util: float) -> tuple[Held, ...]:
    """The GPUs among ``gpus`` that lack ``util`` × their memory free, with what is held."""
    return tuple(Held(g.index, g.memory_used_bytes or 0, g.memory_bytes) for g in gpus
                 if (free := _free_share(g)) is not None and free < util)


def memory_in_use(gpus: Sequence[Gpu], util: float) -> str:
    """Which of ``gpus`` lack ``util`` × their memory free, and what other processes hold."""
    return ", ".join(h.describe() for h in held_by_others(gpus, util))


# vLLM's budget is utilization × the total CUDA reports (torch.cuda.mem_get_info), which leaves
# out what the driver keeps: the H200 NVML reads as 140.40 GiB is 139.8 GiB to CUDA in every
# vLLM log ("Free memory on device (139.29/139.8 GiB)"). Not measured on other cards: the same
# amount is assumed there.
CUDA_RESERVED_BYTES = int(0.61 * GIB)


@dataclass(frozen=True)
class Fit:
    budget: float  # bytes per GPU: gpu_memory_utilization × the smallest card
    weights: float  # on the fullest GPU
    overhead: float  # activations, CUDA graphs, buffers outside torch, the driver's reserve
    kv_budget: float  # KV bytes of one replica, all its GPUs together
    context: int  # the context to plan: below the longest the estimate admits by the margin
    limits: EngineLimits
    cushion: float  # the most the margin keeps back of ``kv_budget`` (context_cushion)
    kv_dtype_bytes: int = 2  # 1 under --kv-cache-dtype fp8
    kv_blocks: int = 0  # blocks of vLLM's KV pool in ``kv_budget`` (pool_blocks)
    offload: float = 0.0  # bytes of each GPU's weights kept in CPU memory (--cpu-offload-gb)
    tp: int = 1  # the tensor-parallel size: a hybrid's pages depend on it (tp_share)

    @property
    def need_fixed(self) -> float:
        return self.weights + self.overhead


def fit(
    m: ModelSpec, gpus: Sequence[Gpu], tp: int, pp: int, util: float, kv_dtype_bytes: int = 2,
    offload: float = 0.0, graphs: CudaGraphs | None = None,
) -> Fit:
    """The memory of ``m`` as TP × PP on ``gpus``; ``offload``: bytes of each GPU's weights
    kept in CPU memory (vLLM's --cpu-offload-gb); ``graphs``: the CUDA graphs the engine
    captures (None: vLLM's default on these GPUs)."""
    smallest = min(gpus, key=lambda g: g.memory_bytes)
    budget = smallest.memory_bytes * util  # vLLM sizes every worker like the smallest
    lim = vllm_defaults(smallest.memory_bytes, smallest.name)
    if graphs is None:
        graphs = default_graphs(gpus, lim)
    weights = max(0.0, weights_per_gpu(m, tp, pp, gpus) - offload)
    # the budget is of the total CUDA reports: the driver's reserve leaves util × it out
    overhead = overhead_per_gpu(m, tp, pp, lim, graphs)
    over = overhead + util * CUDA_RESERVED_BYTES
    kv_budget = replica_kv_budget(m, tp, pp, budget, weights, over)
    kv = tp_share(m, tp)
    # the driver's reserve is not the estimate's: the margin is kept on the estimate's terms
    cushion = context_cushion(overhead, kv_shards(m, tp, pp))
    context = planned_context(kv, kv_budget, lim.batched_tokens, kv_dtype_bytes, cushion=cushion)
    blocks = pool_blocks(kv, kv_budget, kv_dtype_bytes)
    return Fit(budget, weights, over, kv_budget, context, lim, cushion, kv_dtype_bytes, blocks,
               offload, tp)


def replica_kv_budget(
    m: ModelSpec,
    tp: int,
    pp: int,
    budget: float,
    weights: float,
    overhead: float,
) -> float:
    """KV bytes of one replica: what each GPU's budget leaves after its weights (those it
    holds: less any offloaded to the CPU) and the overhead, over all the KV shards."""
    return max(0.0, budget - weights - overhead) * kv_shards(m, tp, pp)


def need_per_gpu(f: Fit, m: ModelSpec, tp: int, pp: int, tokens: int) -> float:
    """Bytes per GPU to hold the weights, the overhead, vLLM's null block and one request of
    ``tokens``, with the margin kept on the KV part (:func:`budget_holding`)."""
    share = tp_share(m, tp)
    kv = (request_kv_bytes(share, tokens, f.limits.batched_tokens, f.kv_dtype_bytes)
          + null_block_bytes(share, f.kv_dtype_bytes))
    return f.need_fixed + budget_holding(kv, f.cushion) / kv_shards(m, tp, pp)


def sequences_held(m: ModelSpec, f: Fit, tokens: int) -> int:
    """How many requests of ``tokens`` the fit's KV cache holds at once (:func:`requests_held`:
    block rounding, sliding windows and the batches in flight as vLLM's scheduler counts them),
    at least one (a fit holds its context)."""
    per = request_blocks(tp_share(m, f.tp), tokens, f.limits.batched_tokens, f.kv_dtype_bytes)
    return max(1, requests_held(f.kv_blocks, per))


# The blocks vLLM's block pool takes for itself when it is made: the null block, which padded
# block tables point at and no request ever gets (vllm/v1/core/block_pool.py BlockPool).
NULL_BLOCKS = 1


def requests_held(kv_blocks: int, per_request: int) -> int:
    """Whole requests of ``per_request`` blocks (:func:`request_blocks`) a pool of ``kv_blocks``
    (:func:`pool_blocks`) holds at once: its free blocks, all but the null block, over one
    request's. vLLM's logged "Maximum concurrency" divides the whole pool and so says one more
    where the blocks divide evenly (4.00x for four 8,192-token Llama-3.1-8B requests in 4 GiB,
    of which three fit)."""
    return max(0, kv_blocks - NULL_BLOCKS) // per_request if per_request else 0
