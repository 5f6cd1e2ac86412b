"""Memory fit: what vLLM holds on each GPU, the KV cache left, and the context it will accept. Pure.

vLLM sizes its KV cache at start-up (vllm/v1/worker/gpu_worker.py ``determine_available_memory``):

    KV memory = gpu_memory_utilization × total memory
                − weights − peak activations of one profiling forward pass
                − memory outside torch that grew meanwhile (cuBLAS, NCCL) − CUDA-graph estimate

The profiling pass runs ``max_num_batched_tokens`` tokens (vLLM's default depends on the GPU:
8,192 for the OpenAI server on a card of ≥ 70 GiB that is not an A100, 16,384 from 160 GiB,
2,048 below; vllm/engine/arg_utils.py) and a sampler over ``max_num_seqs`` rows of logits. It
then refuses to start when one request of ``max_model_len`` tokens does not fit
(vllm/v1/core/kv_cache_utils.py ``_check_enough_kv_cache_memory``), where a sliding-window
layer holds ``window − 1 + max_num_batched_tokens`` tokens, not just its window.

Everything here is an estimate of those figures, so the context the planner sets keeps
``CONTEXT_MARGIN`` below the longest one the estimate admits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.model.modelspec import GIB, KvGroup, ModelSpec
from launcher.probe.topology import Gpu

# Kept below the longest context the estimate admits, so that an estimate a few percent too
# generous (activations, CUDA graphs, allocator slack) still starts. Measured on the lent H200
# (docs/benchmarks.md): the estimate's KV memory against vLLM's own "Available KV cache memory".
CONTEXT_MARGIN = 0.05
BLOCK_TOKENS = 16  # vLLM's GPU block size (the CPU backend uses 128)
# Memory outside torch's allocator that appears after vLLM's baseline snapshot: cuBLAS and
# cuBLASLt workspaces, the sampler's and attention backend's buffers (~0.3-0.6 GiB in vLLM's
# "non-torch memory" log lines), plus NCCL communicators and the custom all-reduce's IPC
# buffers with TP/PP. Assumptions, checked against the H200 logs.
NON_TORCH_BYTES = 0.5 * GIB
PARALLEL_BYTES = 0.5 * GIB
# vLLM subtracts an estimate of the CUDA graphs' memory (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS,
# on by default): a pool per captured batch size, growing with the layers. Assumed: 0.25 GiB plus
# 4 MiB per layer for the default capture sizes.
CUDAGRAPH_BASE_BYTES = 0.25 * GIB
CUDAGRAPH_LAYER_BYTES = 4 * 1024**2


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


def weights_per_gpu(m: ModelSpec, tp: int, pp: int) -> float:
    # PP splits the layers evenly and gives the embedding to the first stage, the LM head to
    # the last (a copy of the embedding when they are tied); TP splits the tables by vocabulary.
    tables = table_bytes(m)
    per_stage = embedding_bytes(m) if pp > 1 else tables
    layers = (m.weight_bytes - tables) * stage_share(m, pp) / tp
    return layers + per_stage / tp + rope_cache_bytes(m)


def kv_shards(m: ModelSpec, tp: int, pp: int) -> float:
    """Into how many parts the KV cache divides: KV heads over TP (replicated past the head
    count), layers over PP (the fullest stage sets the size)."""
    return min(tp, m.num_kv_heads) / stage_share(m, pp)


# ------------------------------------------------------------------------------ activations


def activation_bytes(m: ModelSpec, tp: int, lim: EngineLimits) -> float:
    """Peak of vLLM's profiling run: one forward pass of ``batched_tokens`` tokens, then the
    sampler over ``max_num_seqs`` rows; they run one after the other, so the larger counts."""
    t, h = lim.batched_tokens, m.hidden_size
    qkv = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim / tp
    if m.num_experts:
        k = max(1, m.experts_per_token)
        inter = m.moe_intermediate_size or m.intermediate_size
        # vLLM's fused MoE keeps three caches per routed token: gate+up, activation, down
        mlp = k * (3 * inter / tp + h)
    else:
        mlp = 3 * m.intermediate_size / tp  # gate+up output and the activation
    forward = t * (mlp + qkv + 4 * h) * 2  # bf16: residual, normed input, attention output
    sampler = lim.max_num_seqs * m.vocab_size * 4 * 2  # fp32 logits and their softmax
    return max(forward, sampler)


def cudagraph_bytes(m: ModelSpec, pp: int) -> float:
    return CUDAGRAPH_BASE_BYTES + CUDAGRAPH_LAYER_BYTES * m.num_layers * stage_share(m, pp)


def overhead_per_gpu(m: ModelSpec, tp: int, pp: int, lim: EngineLimits) -> float:
    """Everything vLLM takes from the budget besides weights and KV cache."""
    par = PARALLEL_BYTES if tp * pp > 1 else 0.0
    return NON_TORCH_BYTES + par + activation_bytes(m, tp, lim) + cudagraph_bytes(m, pp)


# ------------------------------------------------------------------------------ KV and context


# vLLM's GPU engine schedules the next step while one runs (async scheduling): two batches are
# in flight, and a sliding-window layer keeps KV for both (VllmConfig.max_in_flight_tokens).
GPU_BATCHES_IN_FLIGHT = 2
CPU_BATCHES_IN_FLIGHT = 1


def vllm_groups(m: ModelSpec) -> list[tuple[KvGroup, int]]:
    """The KV groups vLLM forms, each with how many layers it counts (padding included).

    With one page size for every layer type, vLLM makes groups of as many layers as the
    smallest type has (the largest, when they differ by less than 1.5×) and pads each type's
    last group (kv_cache_utils.py ``_get_kv_cache_groups_uniform_page_size``): Gemma 3's 52
    sliding layers are counted as 60 beside its 10 full ones. Types of different page sizes are
    counted layer by layer here (no padding)."""
    groups = [g for g in m.kv_groups if g.layers]
    if len(groups) < 2 or len({g.bytes_per_token() for g in groups}) > 1:
        return [(g, g.layers) for g in groups]
    sizes = [g.layers for g in groups]
    size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    return [(g, -(-g.layers // size) * size) for g in groups]


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
    request. Matches the H200's refusal of Gemma 3 27B at 131,072 tokens: 17.98 GiB needed."""
    total = 0
    for g, layers in vllm_groups(m):
        page = block * g.bytes_per_token(kv_dtype_bytes)
        total += layers * layer_blocks(g, tokens, batched_tokens, block, in_flight) * page
    return total


def layer_blocks(g: KvGroup, tokens: int, batched_tokens: int, block: int, in_flight: int) -> int:
    """The blocks one layer of group ``g`` holds for one request of ``tokens`` (see
    :func:`request_kv_bytes`)."""
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
    """The longest ``max_model_len`` whose one request passes vLLM's start-up check."""

    def fits(n: int) -> bool:
        return request_kv_bytes(m, n, batched_tokens, kv_dtype_bytes, block, in_flight) <= kv_budget

    lo, hi = 0, max(1, m.max_position_embeddings)
    if fits(hi):
        return hi
    while lo < hi:  # the need grows with the length: bisect, as vLLM's own estimate does
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def planned_context(
    m: ModelSpec,
    kv_budget: float,
    batched_tokens: int,
    kv_dtype_bytes: int = 2,
    *,
    block: int = BLOCK_TOKENS,
    in_flight: int = GPU_BATCHES_IN_FLIGHT,
) -> int:
    """The context to ask vLLM for: the model's own limit, or the longest one that fits in
    ``CONTEXT_MARGIN`` less than the estimated KV budget."""
    return longest_context(
        m,
        kv_budget * (1 - CONTEXT_MARGIN),
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
    return planned_context(
        m, kv_cache_bytes, batched_tokens, block=CPU_BLOCK_TOKENS, in_flight=CPU_BATCHES_IN_FLIGHT
    )


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
    """The token capacity vLLM logs ("KV cache size: N tokens") for ``kv_bytes`` of cache.

    One block of the shared pool spans one layer of each (padded) group: ``num_blocks =
    kv_bytes // (block × bytes per token and layer × group size)``, and the capacity is
    ``num_blocks / blocks one max_model_len request takes × max_model_len``
    (kv_cache_utils.py ``get_kv_cache_config_from_groups``, ``get_kv_cache_capacity``)."""
    groups = vllm_groups(m)
    if not groups:
        return 0
    if len({g.bytes_per_token(kv_dtype_bytes) for g, _ in groups}) > 1:
        need = request_kv_bytes(m, max_model_len, batched_tokens, kv_dtype_bytes, block, in_flight)
        return int(kv_bytes / need * max_model_len) if need else 0
    sizes = [n for _, n in groups]
    size = min(sizes) if len(groups) > 1 else sizes[0]
    page = block * groups[0][0].bytes_per_token(kv_dtype_bytes)
    num_blocks = int(kv_bytes // (page * size))
    per_request = 0
    for g, layers in groups:
        n = layers // size if len(groups) > 1 else 1
        per_request += n * layer_blocks(g, max_model_len, batched_tokens, block, in_flight)
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


@dataclass(frozen=True)
class Fit:
    budget: float  # bytes per GPU: gpu_memory_utilization × the smallest card
    weights: float  # on the fullest GPU
    overhead: float  # activations, CUDA graphs, buffers outside torch
    kv_budget: float  # KV bytes of one replica, all its GPUs together
    context: int  # the context to plan: below the longest the estimate admits by the margin
    limits: EngineLimits
    kv_dtype_bytes: int = 2  # 1 under --kv-cache-dtype fp8

    @property
    def need_fixed(self) -> float:
        return self.weights + self.overhead


def fit(
    m: ModelSpec, gpus: Sequence[Gpu], tp: int, pp: int, util: float, kv_dtype_bytes: int = 2,
    offload: float = 0.0,
) -> Fit:
    """The memory of ``m`` as TP × PP on ``gpus``; ``offload``: bytes of each GPU's weights
    kept in CPU memory (vLLM's --cpu-offload-gb)."""
    smallest = min(gpus, key=lambda g: g.memory_bytes)
    budget = smallest.memory_bytes * util  # vLLM sizes every worker like the smallest
    lim = vllm_defaults(smallest.memory_bytes, smallest.name)
    weights = max(0.0, weights_per_gpu(m, tp, pp) - offload)
    over = overhead_per_gpu(m, tp, pp, lim)
    kv_budget = replica_kv_budget(m, tp, pp, budget, weights, over)
    context = planned_context(m, kv_budget, lim.batched_tokens, kv_dtype_bytes)
    return Fit(budget, weights, over, kv_budget, context, lim, kv_dtype_bytes)


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
    """Bytes per GPU to hold the weights, the overhead and one request of ``tokens``, with the
    margin kept on the KV part."""
    kv = request_kv_bytes(m, tokens, f.limits.batched_tokens, f.kv_dtype_bytes)
    return f.need_fixed + kv / (1 - CONTEXT_MARGIN) / kv_shards(m, tp, pp)
