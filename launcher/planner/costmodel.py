"""Speed: predicted prefill, decode and aggregate tok/s of one candidate layout. Pure.

Memory (what fits, how many sequences the KV cache holds) is :mod:`launcher.planner.memfit`'s; this
module only times a layout. Roofline per forward pass, then the communication the layout adds,
then the fixed costs vLLM's kernels and host pay (docs/planner.md derives it):

- compute: 2 FLOPs per weight of the layers per token, and per LM-head weight per sampled
  sequence (the input embedding is a lookup: :func:`forward_flops`), + causal attention, at an
  achieved fraction of the slowest card's dense BF16 rate; a tensor-parallel group divides it
  by ``tp``.
- memory: every step streams the weights (and the sequences' KV cache) at an achieved fraction
  of the slowest card's memory bandwidth; of a mixture-of-experts only the experts the step's
  tokens route to (``experts_touched``), and 4-bit weights at Marlin's own rate, the same at
  every batch up to 64 rows (``weight_stream_efficiency``). A step costs the larger of compute
  and memory.
- fixed costs, by how the served engine's CUDA graphs run the step (``Layout.graphs``,
  :mod:`launcher.planner.cudagraphs`): past the capture range a layer takes at least the host's
  launching of it (``eager_host_layer_s``: the dense layer's, the fused-MoE op's dispatch, a
  family's own extras from the family registry), which the GPU's arithmetic runs beside, and
  the GPU pays ``EAGER_LAYER_S`` a layer; within it a prompt step replays piecewise graphs
  (``piecewise_host_layer_s`` a layer for the attention run between the pieces; the GPU
  pays the layer's elementwise kernels, ``elementwise_layer_s``, which an eager layer's fitted
  ``EAGER_LAYER_S`` holds) and a decode
  step one full graph, each padded to the next captured size, whose every kernel pays the
  card's per-kernel graph cost (``graph_kernel_s``; the layer's kernels from the family
  registry); every step ``STEP_OVERHEAD_S`` and the engine core's work in the model's extra
  KV-cache groups (``LayerHost.engine_step_s``), in series with a prompt step's GPU work and
  beside a decode step's under vLLM's asynchronous scheduling.
- the host (:class:`hardware.HostProfile`, one model of it): a step lasts at least the front
  end's work for its sequences (a fixed part and a part per sequence, in processes beside the
  GPU's: the longer of the two counts), and a request pays a fixed cost and one per prompt token
  on its way in.
- tensor parallel: two all-reduces per layer of ``tokens × hidden`` activations, each costing
  ``latency + 2(n-1)/n · bytes / link`` on the slowest link of the group (NVLink, P2P over PCIe
  at the negotiated width, or NCCL's SHM bounce through host memory).
- pipeline parallel: stages run one after another for a single sequence (a hop of
  ``tokens × hidden`` between them); with many sequences ``pp`` micro-batches keep every stage busy.
- data-parallel replicas split the streams between them and add up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.model import families, quantization
from launcher.model.modelspec import KvGroup, ModelSpec
from launcher.planner import hardware, moetuned
from launcher.planner.asyncsched import vllm_async_scheduling
from launcher.planner.cudagraphs import VLLM_DEFAULT, CudaGraphs, StepMode
from launcher.planner.hardware import (
    ACT_BYTES,
    CPU_GFLOPS_PER_CORE,
    CPU_MEM_GBS,
    CPU_STEP_OVERHEAD_S,
    EAGER_HOST_LAYER_S,
    EAGER_LAYER_S,
    ELEMENTWISE_LAYER_FLOOR_S,
    KERNEL_LAUNCH_S,
    MEM_EFFICIENCY,
    MFU_DECODE,
    MOE_GEMM_EFFICIENCY,
    MOE_LAYER_PREFILL_S,
    OTHER_4BIT_STREAM_EFFICIENCY,
    QUANT_GEMM_FIXED_S,
    QUANT_STREAM_EFFICIENCY,
    SERVER_HOST,
    HostProfile,
    LayerHost,
)
from launcher.planner.memfit import (
    BLOCK_TOKENS,
    embedding_bytes,
    kv_shards,
    stage_share,
    tower_bytes,
    vllm_group_count,
)
from launcher.probe import attentionfit
from launcher.probe.enginestep import EngineStep
from launcher.probe.topology import (
    ASSUMED_PCIE_GEN,
    ASSUMED_PCIE_WIDTH,
    Gpu,
    Pair,
    Topology,
    Transport,
    pair_link,
)


@dataclass(frozen=True)
class Link:
    transport: Transport
    gbs: float  # achieved one-direction bandwidth, GB/s
    latency_s: float


NO_LINK = Link("none", float("inf"), 0.0)


@dataclass(frozen=True)
class Prediction:
    prefill_tok_s: float  # one prompt of ``prompt_tokens``
    decode_tok_s: float  # one stream
    throughput_tok_s: float  # generated tokens/s over all streams at the given concurrency
    ttft_s: float
    e2e_s: float  # one request: prompt_tokens in, gen_tokens out
    batch: int  # streams per replica the KV cache holds at once (≤ concurrency share)


@dataclass(frozen=True)
class Layout:
    """What the cost model needs of a candidate: one replica's GPUs per stage, and the links."""

    tp: int
    pp: int
    dp: int
    stages: tuple[tuple[Gpu, ...], ...]  # one replica: pp stages of tp GPUs each
    tp_link: Link
    pp_link: Link  # the slowest hop between consecutive stages
    kv_budget_bytes: float  # KV-cache memory of one replica, all its GPUs together
    host: HostProfile = SERVER_HOST  # the serving host's work around the GPUs'
    # the served engine's CUDA graphs (launcher.planner.cudagraphs: the one place that says
    # which steps replay which graphs); by default vLLM's for max_num_seqs 256
    graphs: CudaGraphs = VLLM_DEFAULT

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        """One replica's GPUs, every stage's, in stage order."""
        return tuple(g for stage in self.stages for g in stage)


# --------------------------------------------------------------------------------------- links


def pcie_gbs(g: Gpu) -> float:
    """Achieved PCIe rate of a card: the generation it can reach (idle cards drop to Gen1, so
    the current generation misleads) at the width it negotiated (x8/x4 slots show there)."""
    gen = g.pcie_gen_max or g.pcie_gen_cur or ASSUMED_PCIE_GEN
    # Unknown width: the slow case (topology.assumption_notes says so in the plan), capped by max.
    width = g.pcie_width_cur or min(g.pcie_width_max or ASSUMED_PCIE_WIDTH, ASSUMED_PCIE_WIDTH)
    return hardware.PCIE_LANE_GBS.get(gen, 0.985) * width * hardware.PCIE_EFFICIENCY


def link_between(topo: Topology, a: Gpu, b: Gpu) -> Link:
    """Assumed (or, after `probe --measure`, measured) link between two GPUs of one machine."""
    pair: Pair = topo.pair(a.index, b.index)
    transport = pair_link(pair)
    m = pair.measured
    if transport == "nvlink":
        per = hardware.gpu_model(a.name, a.cc).nvlink_gbs_per_link or 14.0625
        gbs = max(pair.nvlinks, 1) * per * hardware.NVLINK_EFFICIENCY
    elif transport == "p2p-pcie":
        gbs = min(pcie_gbs(a), pcie_gbs(b))
    else:
        gbs = min(pcie_gbs(a), pcie_gbs(b)) * hardware.SHM_EFFICIENCY
    if transport != "nvlink" and pair.common_ancestor in ("SYS", None):  # unknown: across sockets
        gbs *= hardware.CROSS_SOCKET_FACTOR
    if m is not None and m.allreduce_gbs:
        gbs = m.allreduce_gbs  # what the all-reduce itself achieved: no factor needed
    elif m is not None and m.bandwidth_gbs:
        gbs = m.bandwidth_gbs if transport != "shm" else m.bandwidth_gbs * hardware.SHM_EFFICIENCY
    latency = hardware.ALLREDUCE_LATENCY_S.get(transport, 12e-6)
    if m is not None and m.latency_us:
        latency = m.latency_us * 1e-6  # replayed from a CUDA graph, as vLLM runs it
    return Link(transport, gbs, latency)


def worst_link(links: Sequence[Link]) -> Link:
    return min(links, key=lambda k: (k.gbs, -k.latency_s)) if links else NO_LINK


def group_link(topo: Topology, gpus: Sequence[Gpu]) -> Link:
    """A ring all-reduce goes as fast as its slowest pair."""
    return worst_link([link_between(topo, a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]])


# ------------------------------------------------------------------------------ rates of a card


# Each card's figures with what `probe --measure` timed on it (Gpu.perf) over the table's.


def _mem_bytes_s(gpus: Sequence[Gpu]) -> float:
    rows = [hardware.gpu_model(g.name, g.cc, g.perf) for g in gpus]
    return min(r.mem_bw_gbs for r in rows) * 1e9 * MEM_EFFICIENCY


def graph_kernel_s(gpus: Sequence[Gpu]) -> float:
    """The slowest card's fixed cost of one kernel in a CUDA-graph replay: measured by `probe
    --measure` (gpuperf.GpuPerf.kernel_s), else its row's shipped figure, else assumed
    (hardware.ASSUMED_GRAPH_KERNEL_S)."""
    rows = [hardware.gpu_model(g.name, g.cc, g.perf) for g in gpus]
    return max((r.graph_kernel_s or hardware.ASSUMED_GRAPH_KERNEL_S for r in rows),
               default=hardware.ASSUMED_GRAPH_KERNEL_S)


def graph_kernel_line(gpus: Sequence[Gpu]) -> str:
    """The plan's line on the per-kernel graph cost its decode steps pay, and where it came
    from: measured on these GPUs, a card's shipped figure, or assumed."""
    kernel = graph_kernel_s(gpus)
    if any(g.perf is not None and g.perf.kernel_s is not None for g in gpus):
        source = "measured on this GPU by `probe --measure`"
    elif any(hardware.gpu_model(g.name, g.cc).graph_kernel_s for g in gpus):
        source = ("the card's shipped figure, DERIVED from the H200's GEMVs replayed from CUDA "
                  "graphs (`probe --measure` times it on this GPU)")
    else:
        source = "ASSUMED, the H200's figure (`probe --measure` times it on this GPU)"
    return (f"decode steps in CUDA graphs: each kernel {kernel * 1e6:.1f} us besides its "
            f"bytes: {source}")


def _flops_s(gpus: Sequence[Gpu], mfu: float) -> float:
    return min(hardware.gpu_model(g.name, g.cc, g.perf).bf16_tflops for g in gpus) * 1e12 * mfu


def _prefill_flops_s(gpus: Sequence[Gpu]) -> float:
    """The slowest card's achieved prefill rate (its own measured or assumed MFU)."""
    rows = [hardware.gpu_model(g.name, g.cc, g.perf) for g in gpus]
    return min(r.bf16_tflops * r.prefill_mfu for r in rows) * 1e12


def experts_touched(m: ModelSpec, tokens: float) -> float:
    """Expected distinct experts a layer routes ``tokens`` tokens to: E·(1 − (1 − k/E)^tokens)
    for top-k of E experts chosen independently per token."""
    e, k = m.num_experts, max(1, m.experts_per_token)
    if not e:
        return 0.0
    untouched: float = (1.0 - min(k, e) / e) ** max(1.0, tokens)
    return e * (1.0 - untouched)


def streamed_weight_bytes(m: ModelSpec, tokens: float = 1.0) -> float:
    """Bytes one forward pass of ``tokens`` tokens reads: every weight but the input embedding
    table (one row per token is read), the towers (run for images, not text tokens) and the
    allocator's slack from repacking 4-bit layers (``ModelSpec.load_growth_bytes``), and of
    a mixture-of-experts only the experts routed to. A batched step touches most experts
    (E·(1 − (1 − k/E)^B)), a single token only k."""
    untied_embed = 0 if m.tied_embeddings else embedding_bytes(m)
    # of what vLLM's repacking adds (ModelSpec.load_growth_bytes) only the zero points are read:
    # the rest is allocator slack no kernel touches
    slack = m.load_growth_bytes - m.machete_zero_bytes
    dense = m.weight_bytes - slack - untied_embed - tower_bytes(m)
    if not m.num_experts:
        return dense
    if m.experts_per_token >= m.num_experts or m.params <= 0:
        return dense  # every expert runs for every token: every weight is read
    expert_share = (
        (m.params - m.active_params) / m.params / (1 - m.experts_per_token / m.num_experts)
    )
    experts = dense * expert_share  # all experts' bytes
    return dense - experts + experts * experts_touched(m, tokens) / m.num_experts


def weight_stream_efficiency(m: ModelSpec, batch: float, gpus: Sequence[Gpu] = ()) -> float:
    """Share of MEM_EFFICIENCY that weight streaming reaches, at ``batch`` rows a GEMM, on
    ``gpus`` (their compute capability picks the 4-bit kernel: quantization.mixed_input_gemm).

    Which kernel: on compute capability 9.0 vLLM runs Machete, which passes over the weights
    once for every row; elsewhere Marlin, which passes over them again for every 64 rows, so
    past 64 rows its weights' read is that many passes (the arithmetic usually longer still).
    The pass's rate below was measured on the H200, where the kernel was Machete; Marlin's
    pass is assumed to stream at the same share (not measured on any card).

    4-bit weights (AWQ/GPTQ) run through vLLM's mixed-input GEMM on every step, decode and
    prefill alike (vLLM 0.26 converts a compatible AWQ checkpoint to ``awq_marlin``:
    ``AWQMarlinLinearMethod.apply`` -> ``marlin_utils.apply_awq_marlin_linear`` ->
    ``ops.marlin_gemm``; GPTQ likewise). Marlin multiplies the activations in 16-row tensor-core
    tiles, up to four of them (64 rows) per pass over the weights, and in that pass loads every
    4-bit weight with its group's scale and zero point (both in ``weight_bytes``) and
    dequantizes it on the CUDA cores once, whatever the rows: up to 64 rows its time is the
    pass, not the rows, so it does NOT approach the bf16 rate as the batch grows (the
    assumption until issue 22 ramped it to the bf16 rate at 16 sequences; the H200's Qwen2.5-32B
    AWQ shape then stepped in 11.5 ms at one stream and 13.3 ms at 32, where the weights' pass
    and the KV read explain both at one rate). The rate of the pass is
    ``QUANT_STREAM_EFFICIENCY`` of the bf16 path's, each GEMM besides paying a fixed
    QUANT_GEMM_FIXED_S (:func:`quant_gemm_fixed_s`): a small layer's GEMMs are further from
    the rate than a large one's (the H200's 8B to 70B AWQ records). Past 64 rows the arithmetic (the
    prefill's and the batched decode's compute terms) takes over. ``batch`` is kept for the
    rows a GEMM runs, which decide Marlin's passes."""
    if m.quantization in ("awq", "gptq"):
        worst = max((quantization.mixed_input_gemm(g.cc).passes(batch) for g in gpus),
                    default=1.0)
        return QUANT_STREAM_EFFICIENCY / worst
    if m.quantization and m.weight_bits <= 4:
        return OTHER_4BIT_STREAM_EFFICIENCY
    return 1.0


def quant_gemm_fixed_s(m: ModelSpec, layers: float) -> float:
    """The fixed cost ``layers`` layers' 4-bit mixed-input GEMMs (AWQ/GPTQ) pay beyond their
    bytes and their graph kernels' cost: QUANT_GEMM_FIXED_S each,
    quantization.MIXED_INPUT_GEMMS_PER_LAYER a layer; 0 for other weights."""
    if m.quantization not in ("awq", "gptq"):
        return 0.0
    return layers * quantization.MIXED_INPUT_GEMMS_PER_LAYER * QUANT_GEMM_FIXED_S


def moe_layers(m: ModelSpec) -> int:
    """Decoder layers whose MLP is the fused-MoE op: all but the dense-MLP ones
    (ModelSpec.dense_mlp_layers: DeepSeek's first_k_dense_replace and the like); 0 for a dense
    model. The one count the roofline's kernels and the kernel table's step shape share."""
    return max(1, m.num_layers - m.dense_mlp_layers) if m.num_experts else 0


def routed_expert_params(m: ModelSpec) -> float:
    """The routed experts' weights one token's forward multiplies (top-k of E in every MoE
    layer), as :func:`streamed_weight_bytes` splits the model: 0 for a dense model."""
    if not m.num_experts or m.experts_per_token >= m.num_experts or m.params <= 0:
        return 0.0
    share = m.experts_per_token / m.num_experts
    return (m.params - m.active_params) / (1 - share) * share


def moe_gemm_efficiency(m: ModelSpec, lay: Layout) -> float:
    """The share of the prefill GEMM rate vLLM's fused-MoE op reaches on ``lay``'s GPUs: the
    dense rate where vLLM ships a tuned Triton config for the experts' shape on every GPU
    (launcher.planner.moetuned), ``MOE_GEMM_EFFICIENCY`` (measured under the default config)
    where it does not. The tuned case at the dense rate is an ASSUMPTION the one tuned record
    agrees with: the Qwen3-30B-A3B shape (128 experts of 768, tuned on the H200) ran its
    8,192-token chunks at about 2.0 ms a layer, which the dense rate gives and 0.56 does not."""
    gpus = lay.gpus
    width = m.moe_intermediate_size // max(1, lay.tp)  # vLLM's N: a rank's expert width
    if gpus and all(moetuned.tuned(g.name, m.num_experts, width) for g in gpus):
        return 1.0
    return MOE_GEMM_EFFICIENCY


def moe_gemm_excess_flops(m: ModelSpec, lay: Layout, tokens: float) -> float:
    """What the routed experts' GEMMs of ``tokens`` tokens cost beyond their FLOPs at the
    prefill rate, in FLOPs at that rate (:func:`moe_gemm_efficiency`)."""
    if not m.num_experts:
        return 0.0
    return 2.0 * routed_expert_params(m) * tokens * (1.0 / moe_gemm_efficiency(m, lay) - 1.0)


# --------------------------------------------------------------------------------- step times


def _allreduce_s(link: Link, n: int, nbytes: float) -> float:
    if n <= 1:
        return 0.0
    return link.latency_s + 2 * (n - 1) / n * nbytes / (link.gbs * 1e9)


def _hop_s(link: Link, nbytes: float) -> float:
    return link.latency_s + nbytes / (link.gbs * 1e9)


def gemm_flops(token_params: float, head_params: float, tokens: float, sampled: float) -> float:
    """The matmul FLOPs of a forward pass of ``tokens`` tokens of which ``sampled`` positions
    sample: 2 per layer weight per token, 2 per LM-head weight per sampled position (vLLM
    computes logits only at its ``logits_indices``: one per running sequence that samples; a
    prompt chunk that is not the prompt's last samples nothing). The input embedding is a row
    lookup: no FLOPs. The weights are still read once a step (streamed_weight_bytes)."""
    return 2.0 * (token_params * tokens + head_params * sampled)


def forward_flops(m: ModelSpec, tokens: float, sampled: float) -> float:
    """:func:`gemm_flops` of ``m`` (ModelSpec.token_params, ModelSpec.lm_head_params)."""
    return gemm_flops(m.token_params, m.lm_head_params, tokens, sampled)


# ----------------------------------------------------------------- attention over the context

# FlashAttention's softmax takes one exponential per (query, key, query head) on the GPU's
# special-function units, which run far below its tensor cores: an H100 SXM has 3.9 TFLOPS of
# exponentials against 989 of BF16 matmul (FlashAttention-3 paper, Shah et al. 2024, section
# 3), so one exponential costs as long as 256 matmul FLOPs. Assumed for every card (no other
# card's figure is in the table), and not overlapped with the matmuls (FlashAttention-2's
# schedule, which vLLM runs before Hopper; FlashAttention-3 overlaps part of it, so on Hopper
# this is the slow side). With head_dim 128 it makes attention 1.5x its matmuls' time.
EXP_FLOP_EQUIVALENT = 256.0
# The host's cost of a prompt's length before its first step, paid whether or not the prefix is
# cached: the host profile's (hardware.SERVER_HOST.prompt_token_s, where its source is said).
PROMPT_TOKEN_HOST_S = SERVER_HOST.prompt_token_s


@dataclass(frozen=True)
class AttentionWork:
    """Attention of ``tokens`` new tokens after ``depth`` tokens already in the KV cache, all
    layers of one replica together: the work that grows with the context, besides the GEMMs."""

    flops: float  # QK^T and PV matmuls
    exps: float  # softmax exponentials: one per (query, key, query head)
    kv_bytes: float  # the attended keys' KV read from memory, once per step


def causal_pairs(tokens: int, depth: int, window: int | None = None) -> float:
    """(query, key) pairs of ``tokens`` new tokens at positions depth+1 … depth+tokens, each
    attending to itself and every earlier token, or to the last ``window`` of them (the
    layer kinds' one rule: :meth:`KvGroup.pairs`)."""
    return float(KvGroup(0, 0, 0, window).pairs(depth, depth + tokens))


Span = tuple[int, int]  # a request's new tokens in a step: positions start … end - 1 (0-based)


def chunked_pairs(m: ModelSpec, spans: Sequence[Span]) -> float | None:
    """The (query, key) pairs a chunked-attention layer of ``m`` attends over for queries at
    ``spans`` (:meth:`KvGroup.pairs`: each query its own chunk's prefix); None where ``m`` has
    no chunked layers. What :func:`attention_work` and :func:`decode_step_s` take from a step
    whose queries are summed (the scheduler simulation's): a chunked layer's keys saw with
    the position, so no total of contexts gives them."""
    chunked = next((g for g in m.kv_groups if g.chunked and g.window), None)
    if chunked is None:
        return None
    return float(sum(chunked.pairs(a, b) for a, b in spans))


def attention_work(m: ModelSpec, tokens: int, depth: int = 0, *, pairs: float | None = None,
                   chunk_pairs: float | None = None, kv_dtype_bytes: int = 2) -> AttentionWork:
    """The attention of ``tokens`` new tokens after ``depth`` cached ones, from the model's own
    attention shape: per KV group (full or sliding-window layers, each with its head_dim), the
    query heads' QK^T and PV over the keys each query attends to, capped by the window; MLA
    (``KvGroup.latent``) attends in its latent space (kv_lora_rank + rope dims per head, the
    absorbed form vLLM decodes with: an upper bound for its prefill, which up-projects the
    cached latents instead), and reads the latent cache, not per-head K and V. GQA shares one
    KV head among several query heads: the FLOPs count query heads, the bytes KV heads. With
    ``pairs`` (a scheduler step's chunks and decoders summed) the pairs are given and the keys
    read per query are their mean: a sliding layer's capped at its window; a chunked layer's
    are ``chunk_pairs`` (:func:`chunked_pairs` of the step's queries), or where not given at
    most a chunk a query. Without ``pairs`` each kind's pairs and keys are its own rule's
    (:meth:`KvGroup.pairs`, :meth:`KvGroup.keys_read`): a chunked layer's query reads its own
    chunk's prefix only. Layers that share another layer's KV cache (Gemma 4) attend like the
    first group's.

    MLA with its sizes known (``m.mla``): a step of more than one new token runs vLLM's prefill
    form (launcher.model.mla): the latents decompressed by kv_b_proj, then multi-head attention
    with q/k head dim nope + rope and v head dim v_head_dim, the dims counted here (GLM-4.7-Flash
    256 + 256 a pair and head, where the absorbed form's 576 + 576 counted 2.25x the matmuls);
    one new token runs the absorbed (decode) form. A mixed step's decoders are counted in the
    prefill form too (their pairs are a small share of a step with a prompt chunk), and the
    cached prefix's decompression GEMM (2 x kv_lora_rank x heads x (nope + v) a cached token,
    about 3% of a 16k prompt's second chunk's attention) is left out."""
    groups = m.kv_groups
    spare = m.num_layers - sum(g.layers for g in groups)
    flops = exps = kv = 0.0
    prefill_form = m.mla is not None and tokens > 1
    for i, g in enumerate(groups):
        layers = g.layers + (max(0, spare) if i == 0 else 0)
        if pairs is None:
            n = float(g.pairs(depth, depth + tokens))
            keys = float(g.keys_read(depth, depth + tokens))
        else:
            if not g.window:
                n = pairs
            elif g.chunked and chunk_pairs is not None:
                n = chunk_pairs
            else:
                n = min(pairs, tokens * g.window)
            keys = n / max(1, tokens)
        # QK^T over the key dim, PV over the value dim (MLA: both the latent in the absorbed
        # form; the decompressed heads' in the prefill form, see above)
        qk = pv = float(g.head_dim)
        if g.latent and prefill_form and m.mla is not None:
            qk, pv = float(m.mla.qk_head_dim), float(m.mla.v_head_dim)
        flops += layers * 2.0 * m.num_heads * (qk + pv) * n
        exps += layers * m.num_heads * n
        kv += layers * g.bytes_per_token(kv_dtype_bytes) * keys
    return AttentionWork(flops, exps, kv)


def attention_s(m: ModelSpec, lay: Layout, work: AttentionWork) -> float:
    """The attention kernels' time on one replica: matmuls and exponentials at the card's
    prefill rate over the TP group, or the KV read at its memory rate, whichever is longer
    (a stage after another: PP adds no speed to one step)."""
    gpus = lay.gpus
    compute = (work.flops + EXP_FLOP_EQUIVALENT * work.exps) / (lay.tp * _prefill_flops_s(gpus))
    # TP ranks read their KV heads' share; MLA's one latent per token is on every rank whole
    shards = 1 if any(g.latent for g in m.kv_groups) else min(lay.tp, max(1, m.num_kv_heads))
    memory = work.kv_bytes / (shards * _mem_bytes_s(gpus))
    return max(compute, memory)


def prefill_step_s(m: ModelSpec, lay: Layout, tokens: int, *, depth: int = 0,
                   pairs: float | None = None, chunk_pairs: float | None = None,
                   sequences: int = 1, sampled: float | None = None) -> float:
    """One engine step prefilling ``tokens`` new tokens after ``depth`` tokens already cached,
    alone on one replica; or, with ``pairs``, a step of ``tokens`` new tokens whose attention
    spans that many (query, key) pairs (prompt chunks after a cached prefix, decoders: the
    scheduler simulation's), a chunked-attention layer ``chunk_pairs`` of them
    (:func:`chunked_pairs`). The GEMMs are bound by arithmetic or by the weights' read; the
    attention kernels run after them in each layer, over the context (:func:`attention_work`:
    the model's heads, head_dim, windows and MLA latent; :func:`attention_s`). The plain
    plan's prefill and the scheduler simulation's steps are this one model too. A step never
    takes less than the host's front end needs for its ``sequences`` (:class:`HostProfile`).
    ``sampled``: the positions the LM head runs for (:func:`forward_flops`); by default one
    per sequence (a whole prompt, or a prompt's last chunk), 0 for a chunk that is not.
    Within the served engine's CUDA-graph range (``lay.graphs``) the step replays piecewise
    graphs padded to the next captured size: the GEMMs run the padded rows, the attention (run
    eagerly between the pieces) the real ones; past it every kernel is launched eagerly."""
    mode, rows, work_s = _prefill_work(m, lay, tokens, depth=depth, pairs=pairs,
                                       chunk_pairs=chunk_pairs, sequences=sequences,
                                       sampled=sampled)
    return max(_prefill_layers_s(m, lay, rows, work_s, mode),
               host_step_floor_s(m, lay.host, sequences))


def _prefill_work(m: ModelSpec, lay: Layout, tokens: int, *, depth: int = 0,
                  pairs: float | None = None, chunk_pairs: float | None = None,
                  sequences: int = 1, sampled: float | None = None
                  ) -> tuple[StepMode, int, float]:
    """:func:`prefill_step_s`'s step before its per-layer and fixed costs: how the served
    engine's graphs run it, the rows its GEMMs run (padded within the graphs) and the GPU's
    arithmetic or weights' read with the attention, over the TP group."""
    gpus = lay.gpus
    attn = attention_s(m, lay, attention_work(m, tokens, depth, pairs=pairs,
                                              chunk_pairs=chunk_pairs))
    heads = sequences if sampled is None else sampled
    mode = lay.graphs.mode(tokens, tokens)
    rows = lay.graphs.padded(tokens)
    # the routed experts' grouped GEMMs run below the dense GEMMs' rate without a tuned config
    compute = ((forward_flops(m, rows, heads) + moe_gemm_excess_flops(m, lay, rows))
               / (lay.tp * _prefill_flops_s(gpus)))
    # a prompt's GEMMs read the weights through the same kernels a decode step does (Marlin's
    # pass for 4-bit weights: weight_stream_efficiency)
    memory = (streamed_weight_bytes(m, tokens) / weight_stream_efficiency(m, rows, gpus)
              / (lay.tp * _mem_bytes_s(gpus)))
    return mode, rows, max(compute, memory) + attn


def _prefill_layers_s(m: ModelSpec, lay: Layout, tokens: int, work_s: float,
                      mode: StepMode = "eager") -> float:
    """A prefill step whose arithmetic takes ``work_s`` over the TP group: with its
    all-reduces, PP hops, per-layer launches and the engine core's overhead. ``mode``: how
    the served engine's graphs run it (eager, or piecewise graphs within their range)."""
    gpu_layer, host_layer, hops = _prefill_layer_parts(m, lay, tokens, work_s, mode)
    return (m.num_layers * max(gpu_layer, host_layer) + hops
            + layer_host(m, lay.host).engine_step_s(tokens))


def _prefill_layer_parts(m: ModelSpec, lay: Layout, tokens: int, work_s: float,
                         mode: StepMode) -> tuple[float, float, float]:
    """A prefill step's GPU time a layer, the host's a layer and its PP hops
    (:func:`_prefill_layers_s`)."""
    act = tokens * m.hidden_size * ACT_BYTES
    comm = 2 * m.num_layers * _allreduce_s(lay.tp_link, lay.tp, act)
    hops = (lay.pp - 1) * _hop_s(lay.pp_link, act)
    # per layer: the GPU's share of the work (arithmetic or weights, all-reduces, an eager
    # layer's kernels' own cost) against the host's launching of it, whichever is longer
    # EAGER_LAYER_S, fitted to eager runs, holds the layer's elementwise kernels; a layer of
    # piecewise graphs drops the rest of it (hardware.EAGER_LAYER_S says which) but runs those
    extra = (EAGER_LAYER_S if mode == "eager"
             else elementwise_layer_s(m, lay, tokens) if mode == "piecewise" else 0.0)
    gpu_layer = (work_s + comm) / m.num_layers + extra
    return gpu_layer, layer_host(m, lay.host).per_layer_s(mode), hops


def first_token_launch_wait_s(m: ModelSpec, lay: Layout, tokens: int, depth: int = 0) -> float:
    """What a lone prompt's first token waits, besides its last prompt step (``tokens`` new
    tokens after ``depth``), for the engine core to launch the step after it. Under vLLM's
    asynchronous scheduling the engine core keeps two steps in flight
    (vllm/v1/engine/core.py ``EngineCore.step_with_batch_queue``, a batch queue of 2, the
    AsyncScheduler giving the request a placeholder token): once it has launched the prompt
    step it schedules and launches the request's first decode step, and only then blocks on the
    prompt step's output and hands the first token over. That launch is the engine core's own
    work a decode step (:meth:`LayerHost.engine_step_s`: scheduling, preparing the inputs and
    the attention metadata of every KV-cache group, the graph's replay and the sampler's
    launch); the GPU still running the prompt step hides it: only what outlasts
    the GPU's lead over the host's launching of the step counts (a host-bound step pays it
    whole, a GPU-bound one nothing). Without async scheduling the output is taken first."""
    if not vllm_async_scheduling(gpu=True, pp=lay.pp):
        return 0.0
    mode, rows, work_s = _prefill_work(m, lay, tokens, depth=depth)
    gpu_layer, host_layer, _ = _prefill_layer_parts(m, lay, rows, work_s, mode)
    lead = m.num_layers * max(0.0, gpu_layer - host_layer)
    return max(0.0, layer_host(m, lay.host).engine_step_s(0) - lead)


def elementwise_layer_s(m: ModelSpec, lay: Layout, tokens: float) -> float:
    """The GPU time of a decoder layer's elementwise kernels over ``tokens`` rows on one TP
    rank: two fused residual-add + RMSNorms (each reads the activations and the residual and
    writes both, whole on every rank), the rotary embedding (reads and writes the rank's query
    and key heads) and, in a dense layer, SiLU-and-mul (reads the rank's gate and up halves,
    writes one; a mixture of experts' runs inside its fused-MoE op). Each kernel's fixed cost
    (``ELEMENTWISE_LAYER_FLOOR_S``, measured) and the bytes at the card's achieved memory rate
    (derived): the roofline's GEMM arithmetic and weight read count none of it."""
    gpus = lay.gpus
    norms = 2 * 4 * m.hidden_size
    rope = 2 * (m.num_heads + m.num_kv_heads) * m.head_dim / lay.tp
    act = 0.0 if m.num_experts else 3 * m.intermediate_size / lay.tp
    per_token = (norms + rope + act) * ACT_BYTES
    return ELEMENTWISE_LAYER_FLOOR_S + tokens * per_token / _mem_bytes_s(gpus)


def layer_host(m: ModelSpec, host: HostProfile) -> LayerHost:
    """``m``'s host work a layer on ``host``, eager (:func:`eager_host_layer_s`) and in
    piecewise graphs (:func:`piecewise_host_layer_s`): the one figure of a step's host floor
    (here, and kernelcost.HostBound) and of the engine core's launching of it (every step
    timer's ``launch_s``: :meth:`LayerHost.launch_s`), with the engine core's work in the
    model's KV-cache groups beyond the first (vLLM's, as memfit.vllm_group_count counts them),
    a step and a prompt token (:meth:`LayerHost.engine_step_s`)."""
    extra = vllm_group_count(m) - 1
    return LayerHost(eager_host_layer_s(m, host), piecewise_host_layer_s(m, host),
                     extra * host.kv_group_prompt_block_s / BLOCK_TOKENS,
                     extra * host.kv_group_step_s)


def piecewise_host_layer_s(m: ModelSpec, host: HostProfile) -> float:
    """The host's work a layer of a piecewise-graph step: the graph pieces' replays and the
    attention ops run eagerly between them (:attr:`HostProfile.piecewise_layer_s`), and the
    part of a family's own extra Python work that runs inside the attention op
    (families.piecewise_layer_host_extra_s: DeepSeek's and GLM's MLA prefill path), not the
    whole eager extra: their grouped router and shared experts are inside compiled pieces. A
    mixture-of-experts layer adds nothing: the fused-MoE op is not a splitting op, so it is
    inside a piece and replayed."""
    speed = host.layer_launch_s / EAGER_HOST_LAYER_S  # this host against the shipped one
    return host.piecewise_layer_s + speed * families.piecewise_layer_host_extra_s(m.family)


def eager_host_layer_s(m: ModelSpec, host: HostProfile) -> float:
    """The host's launching of one eager prefill layer: the dense layer's floor
    (``HostProfile.layer_launch_s``, the reference layer's: Llama's 10 kernels), the kernels the
    family's layer launches beyond those (families.eager_layer_kernels, counted from vLLM's own
    model code by launcher.probe.layerops; KERNEL_LAUNCH_S each, as measured on the H200's
    host) and, for a mixture-of-experts layer, its fused-MoE path's own (MOE_LAYER_PREFILL_S);
    all at the shipped host's speed, scaled with the rest of the host. A kernel's launch is a
    small part of the layer's floor (10 x 7 us of 0.7 ms): what else the host does a layer is
    not yet known, so the floor stays one fitted figure a layer (docs/planner.md, "An eager
    layer's host cost by its kernels").

    vLLM's fused MoE is a custom op that torch.compile leaves opaque, so its router, top-k,
    token-to-expert alignment, two Triton grouped GEMMs, activation and sum are dispatched from
    Python on every eager step. That is host work the GPU's arithmetic runs beside, not after:
    a layer takes the longer of the two. The records say so: the Qwen3-30B-A3B shape's
    512-token prefill took 2.0 ms a layer (100 ms, 48 layers) and its 8,192-token chunk steps
    (the 32-stream run's second wave, 31 prompts' first tokens 194 ms after they were sent)
    about 1.9-2.0 ms a layer with six times the arithmetic; DeepSeek-V2-Lite's 3.0 ms a layer at
    512 tokens and about 3.1 at 8,192 (benchmarks/gpu/results/2026-12-01-h200-issue14/moe,
    2026-12-02-h200-table/mla). Adding the term after the arithmetic (the model until issue 22)
    put those chunks at 2.7 and 3.4 ms a layer. A family whose layer dispatches more from Python
    says so in the family registry (DeepSeek's MLA prefill path, grouped router and shared
    experts: families.DEEPSEEK_EAGER_LAYER_HOST_S)."""
    speed = host.layer_launch_s / EAGER_HOST_LAYER_S  # this host against the shipped one
    kernels = families.eager_layer_kernels(m.family) - families.REFERENCE_LAYER_KERNELS
    extra = families.eager_layer_host_extra_s(m.family)  # the family's own (families.py)
    moe = MOE_LAYER_PREFILL_S if m.num_experts else 0.0
    return host.layer_launch_s + speed * (kernels * KERNEL_LAUNCH_S + moe + extra)


def prefill_at_depth_s(m: ModelSpec, lay: Layout, new: int, depth: int = 0,
                       batched_tokens: int = 8192) -> float:
    """``new`` tokens prefilled after ``depth`` cached tokens, alone on one replica, as vLLM's
    chunked prefill runs them: ``batched_tokens`` a step, each chunk attending to the cached
    prefix and the chunks before it (a cold prompt of D + P tokens is ``new`` = D + P at depth
    0). Each step pays its own fixed costs (per-layer launches, the step overhead); only the
    last samples (the LM head's one row)."""
    total, start, chunk = 0.0, depth, max(1, batched_tokens)
    while start < depth + new:
        n = min(chunk, depth + new - start)
        total += prefill_step_s(m, lay, n, depth=start, sampled=int(start + n >= depth + new))
        start += n
    return total


def decode_keys(m: ModelSpec, context: int, chunk_keys: float | None = None
                ) -> list[tuple[KvGroup, float]]:
    """Each KV group with the keys one decoder at ``context`` tokens (its new token's among
    them) reads a layer (:meth:`KvGroup.keys` of its new token's position, ``context`` - 1):
    its context (full), at most its window (sliding), its own chunk's prefix (chunked:
    10,001 tokens of context with 8,192-token chunks read 1,809 keys, not 8,192). Where the
    step's decoders are summed (the scheduler simulation's mean ``context``) a chunked
    layer's is ``chunk_keys``, their :func:`chunked_pairs` over the decoders (its sawtooth
    has no value at a mean)."""
    return [(g, float(chunk_keys) if g.chunked and chunk_keys is not None
             else float(g.keys(context - 1))) for g in m.kv_groups]


def decode_step_s(m: ModelSpec, lay: Layout, batch: int, context: int, *,
                  chunk_keys: float | None = None) -> float:
    """One decode step that advances ``batch`` sequences of ``context`` tokens by one token:
    the GPUs' work with the engine core's overhead, or the host's front end's work for the
    ``batch`` sequences (:class:`HostProfile`), whichever is longer. A small model's step is
    the host's (the Llama-3.2-1B shape on an H200: 2.04 ms at one stream, 3.24 ms at 32,
    against 0.62 and 0.78 ms of GPU work).

    Within the served engine's CUDA-graph range (``lay.graphs``) the step replays one full
    graph padded to the next captured size (its GEMMs run the padded rows), each of whose
    kernels costs a fixed :func:`graph_kernel_s` besides its bytes and arithmetic (a layer's
    kernels: families.decode_layer_kernels, a mixture-of-experts layer's fused-MoE op's among
    them; a 4-bit model's mixed-input GEMMs a fixed :func:`quant_gemm_fixed_s` more); past it
    the step runs eagerly as a prefill step past the range does: each layer
    launched from the host (:func:`eager_host_layer_s`) beside the GPU's work, which pays
    EAGER_LAYER_S a layer (fitted to eager dense layers: their kernels' fixed costs inside it)
    and the fused-MoE op's kernels beyond a dense MLP's.

    Under vLLM's asynchronous scheduling (a GPU replica without pipeline stages:
    :func:`asyncsched.vllm_async_scheduling`) the engine core prepares the next step while the GPU
    runs this one, so its overhead (STEP_OVERHEAD_S with the work of the model's extra KV-cache
    groups: :meth:`LayerHost.engine_step_s`) runs beside the GPU's step, as the kernel
    tables' steps take it (kernelcost.step_cost's ``overlap_overhead``); with pipeline stages it
    is in series. Checked on the 27 saved one-GPU H200 single-stream decode records
    (docs/planner.md, "A decode step's kernels in its CUDA graph").

    Each sequence's attention reads and multiplies the keys its layers' kinds read
    (:func:`decode_keys`; ``chunk_keys``: a chunked layer's mean over the step's sequences
    where they are summed), not the KV they hold (a chunked layer holds a whole chunk)."""
    gpus = lay.gpus
    micro = max(1.0, batch / lay.pp)  # sequences per pipeline micro-batch
    whole = math.ceil(micro)  # one token a sequence: the step's tokens on a stage
    mode = lay.graphs.mode(0, whole)
    rows = float(lay.graphs.padded(whole)) if mode == "full" else micro
    share = stage_share(m, lay.pp)
    w_stage = streamed_weight_bytes(m, micro) * share / lay.tp
    w_stage /= weight_stream_efficiency(m, rows, gpus)
    # the keys a sequence's layers read (a recurrent layer its whole state), over memfit's
    # division of the cache (KV heads over TP, layers over PP), as sized
    groups = decode_keys(m, context, chunk_keys)
    read = m.recurrent_state_bytes + sum(g.layers * g.bytes_per_token() * keys
                                         for g, keys in groups)
    kv_stage = micro * read / kv_shards(m, lay.tp, lay.pp)
    memory = (w_stage + kv_stage) / _mem_bytes_s(gpus)
    # every sequence samples: one token through the layers and the LM head each; its QK^T and
    # PV (2 matmuls x 2 FLOPs x heads x head_dim a key) over the keys each layer reads (layers
    # sharing another's KV attend like the first group's, as in attention_work)
    spare = max(0, m.num_layers - sum(g.layers for g, _ in groups))
    layer_keys = (sum(g.layers * keys for g, keys in groups)
                  + (spare * groups[0][1] if groups else 0.0))
    flops = (forward_flops(m, rows, micro)
             + micro * 4.0 * m.num_heads * m.head_dim * layer_keys) * share / lay.tp
    compute = flops / _flops_s(gpus, MFU_DECODE)
    act = micro * m.hidden_size * ACT_BYTES
    comm = 2 * m.num_layers * share * _allreduce_s(lay.tp_link, lay.tp, act)
    layers = m.num_layers * share
    moe = moe_layers(m) * share  # layers whose MLP is the fused-MoE op
    dense_kernels = families.decode_layer_kernels(m.family, moe=False)
    moe_extra = families.decode_layer_kernels(m.family, moe=True) - dense_kernels
    kernel_s = graph_kernel_s(gpus)
    if mode == "eager":  # past the graphs: launched layer by layer, as an eager prefill layer
        gpu = (max(memory, compute) + comm + moe * moe_extra * kernel_s
               + layers * EAGER_LAYER_S + quant_gemm_fixed_s(m, layers))
        work = max(gpu, layers * layer_host(m, lay.host).eager_s)
    else:
        kernels = layers * dense_kernels + moe * moe_extra
        work = max(memory, compute) + comm + kernels * kernel_s + quant_gemm_fixed_s(m, layers)
    # the engine core's own work a step, its extra KV-cache groups' with it (the same figure
    # as a prompt step's and every step timer's launch: LayerHost.engine_step_s)
    engine = layer_host(m, lay.host).engine_step_s(0)
    if vllm_async_scheduling(gpu=True, pp=lay.pp):  # the engine core's overhead beside the GPU's
        return max(work, engine, host_step_floor_s(m, lay.host, batch))
    stage = work + _hop_s(lay.pp_link, act)
    # A single micro-batch walks the stages one by one; with ``pp`` of them every stage is busy,
    # so a step (all ``batch`` sequences one token further) takes pp stage-times either way.
    return max(lay.pp * stage + engine, host_step_floor_s(m, lay.host, batch))


def host_step_floor_s(m: ModelSpec, host: HostProfile, sequences: float) -> float:
    """The host's floor under a step of ``sequences`` running sequences of ``m``: the front
    end's, with the engine's KV bookkeeping for each of vLLM's KV-cache groups beyond the first
    (memfit.vllm_group_count; hardware.HostProfile.step_floor_s). The one place the roofline
    and a kernel table's steps (kernelcost.HostBound) take it."""
    return host.step_floor_s(sequences, vllm_group_count(m))


def request_host_s(host: HostProfile, prompt: int) -> float:
    """What a request's first token pays the host besides the engine's steps: its way in (the
    fixed part and its prompt's length: parse, validation, IPC, the prefix cache's hashing;
    paid cached or not) and the first token's way out (:meth:`HostProfile.request_fixed_s`)."""
    return host.request_fixed_s + prompt * host.prompt_token_s


def predict(
    m: ModelSpec,
    lay: Layout,
    *,
    prompt: int,
    gen: int,
    concurrency: int,
    kv_sequences: int,
    max_num_seqs: int = 256,
    batched_tokens: int = 8192,
) -> Prediction:
    """Single-stream figures and aggregate throughput at ``concurrency`` streams (prompt → gen);
    ``kv_sequences``: how many such requests one replica's KV cache holds at once, as the
    memory fit counts them (memfit.sequences_held: this module sizes no memory)."""
    # the prompt in the engine's batched-token chunks (one prefill model: prefill_step_s), after
    # the request's way in through the host
    last = prompt - (prompt - 1) // max(1, batched_tokens) * max(1, batched_tokens)
    ttft = (prefill_at_depth_s(m, lay, prompt, 0, batched_tokens)
            + first_token_launch_wait_s(m, lay, last, prompt - last)
            + request_host_s(lay.host, prompt))
    ctx_mid = prompt + gen // 2
    # a chunked layer's keys over the decode steps' queries (positions prompt … prompt + gen
    # - 2), their exact mean: its sawtooth's value at ctx_mid is not its mean over them
    steps = max(1, gen - 1)
    chunk = chunked_pairs(m, [(prompt, prompt + steps)])
    chunk_keys = None if chunk is None else chunk / steps
    tpot = decode_step_s(m, lay, 1, ctx_mid, chunk_keys=chunk_keys)
    per_replica = max(1, -(-concurrency // lay.dp))
    batch = min(per_replica, max(1, kv_sequences), max_num_seqs)
    # While ``batch`` requests run to completion the replica does their prefills and gen steps.
    # The prompts of streams started together are prefilled together, ``batched_tokens`` per
    # step (chunked prefill): a step's fixed per-layer costs and, for a mixture-of-experts, its
    # read of (nearly) every expert are paid per chunk, not per prompt.
    # Each chunk holds its share of the prompts' causal (query, key) pairs (a prompt attends to
    # itself only) and of the sequences that sample at its end.
    total = batch * prompt
    chunks = -(-total // max(1, batched_tokens))
    prompt_chunk = chunked_pairs(m, [(0, prompt)])
    prefills = chunks * prefill_step_s(
        m, lay, -(-total // chunks), pairs=batch * causal_pairs(prompt, 0) / chunks,
        chunk_pairs=None if prompt_chunk is None else batch * prompt_chunk / chunks,
        sequences=-(-batch // chunks))
    cycle = prefills + gen * decode_step_s(m, lay, batch, ctx_mid, chunk_keys=chunk_keys)
    busy = min(lay.dp, -(-concurrency // batch))  # fewer streams than replicas leave some idle
    throughput = busy * batch * gen / cycle
    return Prediction(
        prefill_tok_s=prompt / ttft,
        decode_tok_s=1.0 / tpot,
        throughput_tok_s=throughput,
        ttft_s=ttft,
        e2e_s=ttft + (gen - 1) * tpot,
        batch=batch,
    )


def cpu_forward_s(flops: float, weight_bytes: float, cores: int,
                  flops_s: float | None = None) -> float:
    """The roofline's time for a forward pass of ``flops`` matmul FLOPs (:func:`gemm_flops`)
    on the CPU: DRAM or AVX bound (at ``flops_s`` where this CPU's rate was measured, else the
    assumed rate per core). The one CPU forward pass: predict_cpu's, the timed step's own model
    (cpu_step_overhead) and the CPU agent plan's scheduler steps (agent.CpuStep) all take it."""
    flops_s = flops_s or max(1, cores) * CPU_GFLOPS_PER_CORE * 1e9
    return max(weight_bytes / (CPU_MEM_GBS * 1e9), flops / flops_s)


@dataclass(frozen=True)
class CpuPrefill:
    """The served engine's time to first token timed here: a request's fixed cost (HTTP,
    scheduling, the first event; no arithmetic) and this CPU's rate at a prompt's arithmetic."""

    first_token_s: float
    flops_s: float


@dataclass(frozen=True)
class CpuStepOverhead:
    """The CPU engine's own cost of a step besides the arithmetic, and where it came from."""

    seconds: float
    measured: bool
    why: str
    prefill: CpuPrefill | None = None  # where `probe --measure` timed the served prefill
    # seconds per (query, key) pair of attention over a cached context, where `probe --measure`
    # timed a prompt after one (cpu_attention_pair_s); None: not timed
    pair_s: float | None = None
    # False: the timing was unreliable and ``pair_s`` is its slower side (attentionfit)
    pair_reliable: bool = True
    # each sequence more in a decode step, beyond its token's arithmetic, where `probe
    # --measure` timed a step of many streams (cpu_sequence_s); 0: not timed
    seq_s: float = 0.0


def cpu_step_overhead(step: EngineStep | None, cores: int) -> CpuStepOverhead:
    """The engine step `probe --measure` timed here, less the roofline's forward pass of the
    model it timed (the embedded tiny model: the engine, not the arithmetic); the assumed
    constant where nothing was measured."""
    if step is None:
        return CpuStepOverhead(
            CPU_STEP_OVERHEAD_S, False,
            f"engine step overhead assumed: {CPU_STEP_OVERHEAD_S * 1e3:.1f} ms (not measured on "
            "this machine: `launcher probe --measure` times it with the real engine)")
    prefill = None
    token, head = step.model_token_params, step.model_head_params
    if (step.prefill_fixed_s is not None and step.prefill_token_s is not None
            and token is not None and head is not None):
        # the timed model's arithmetic per prompt token (its layers': the LM head runs once a
        # request, in the fixed part, and is taken out of it, predict_cpu charging the planned
        # model's own) over its time per prompt token: the rate of small GEMMs and everything
        # else a token costs, so for a larger model (whose GEMMs run nearer the CPU's peak) a
        # rate on the slow side
        rate = gemm_flops(token, head, 1, 0) / step.prefill_token_s
        prefill = CpuPrefill(max(0.0, step.prefill_fixed_s - gemm_flops(0, head, 0, 1) / rate),
                             rate)
    # its decode step: one token through the layers and the LM head (a record before format 5
    # has the model's weights in one count)
    flops = (gemm_flops(token, head, 1, 1) if token is not None and head is not None
             else 2.0 * step.model_params)
    forward = cpu_forward_s(flops, step.model_weight_bytes, cores,
                            flops_s=prefill.flops_s if prefill else None)
    over = max(0.0, step.step_s - forward)
    first = ("" if prefill is None else
             f"; time to first token {prefill.first_token_s * 1e3:.1f} ms + the prompt's "
             f"arithmetic at {prefill.flops_s / 1e9:.0f} GFLOP/s, timed the same way")
    if prefill is None and step.prefill_token_s is not None:
        first += ("; its prefill rate not used: the record does not hold its model's layer "
                  "and LM-head weights apart (`launcher probe --measure` times it again)")
    fit = cpu_attention_fit(step)
    pair = None if fit is None else fit.pair_s
    if fit is not None:
        first += f"; {fit.why}"
    elif prefill is not None:
        first += ("; attention over a cached context not timed in this record (`launcher "
                  "probe --measure` times it where the engine reports its cached tokens)")
    seq, seq_why = cpu_sequence_s(step, cores, prefill.flops_s if prefill else None)
    return CpuStepOverhead(
        over, True,
        f"engine step overhead {over * 1e3:.1f} ms: vLLM's served decode step timed on this "
        f"machine {step.measured_at} ({step.step_s * 1e3:.1f} ms median of {len(step.steps_s)} "
        f"rounds, slowest/fastest {step.spread:.1f}x) less its model's {forward * 1e3:.1f} ms "
        f"forward{first}; {seq_why}", prefill, pair, fit is None or fit.reliable, seq)


def cpu_sequence_s(step: EngineStep, cores: int, flops_s: float | None) -> tuple[float, str]:
    """The served CPU engine's own cost of each sequence more in a decode step (its sampling,
    its output's hop to the API server, its SSE event, its attention at the timed context),
    and the reason: `probe --measure`'s step with ``batch_streams`` streams in flight over its
    one-stream step, less the roofline's arithmetic of the extra tokens (at ``flops_s``, the
    rate timed beside it), per extra sequence. 0 where the record has no such step (before
    format 6): a step at N streams is then the one-stream step plus N tokens' arithmetic, the
    served engine's per-sequence work assumed to be none (on this project's 2-core machine that
    put 8 and 32 streams' output at 1.25-1.70x and 1.48-1.81x of loadgen's, docs/planner.md
    7c)."""
    many, n = step.batch_step_s, step.batch_streams or 0
    if many is None or n < 2:
        return 0.0, ("the step's cost per sequence assumed: none beyond each token's "
                     "arithmetic (not timed in this record: `launcher probe --measure` times "
                     "a step of many streams)")
    token, head = step.model_token_params, step.model_head_params

    def forward(tokens: int) -> float:
        flops = (gemm_flops(token, head, tokens, tokens) if token is not None
                 and head is not None else 2.0 * step.model_params * tokens)
        return cpu_forward_s(flops, step.model_weight_bytes, cores, flops_s=flops_s)

    seq = max(0.0, (many - step.step_s - (forward(n) - forward(1))) / (n - 1))
    return seq, (f"each sequence more in a step {seq * 1e3:.2f} ms: a step of {n} streams "
                 f"timed the same way at {many * 1e3:.1f} ms (median of "
                 f"{len(step.batch_steps_s)} rounds) over the one-stream step")


def cpu_attention_fit(step: EngineStep) -> attentionfit.AttentionFit | None:
    """What `probe --measure`'s paired requests at depth say about attention over a cached
    context (launcher.probe.attentionfit: per pair the deep request over its plain partner,
    less the context's uncached tail at the per-token rate timed here and the host's cost of the
    context's length, PROMPT_TOKEN_HOST_S, which the scheduler's simulation charges too; the
    median, its spread and its plausibility against the prefill rate, and the slower side or
    none where unreliable). None where the record has no timing at depth."""
    if step.depth_tokens is None or step.depth_new_tokens is None or not step.depth_pairs:
        return None
    return attentionfit.fit(step.depth_pairs, depth=step.depth_tokens,
                            new=step.depth_new_tokens, token_s=step.prefill_token_s or 0.0,
                            host_token_s=PROMPT_TOKEN_HOST_S, pair_flops=step.model_pair_flops,
                            # the FLOPs behind the per-token rate it is checked against: a format-5
                            # record's rate is the layers' alone (the LM head's one row and the
                            # embedding's lookup are not in it), so their weights, not all of them
                            params=step.model_token_params or step.model_params)


def cpu_attention_pair_s(step: EngineStep) -> float | None:
    """Seconds per (query, key) pair of attention over a cached context the plan takes from
    `probe --measure`'s timing at depth (cpu_attention_fit); None where it was not timed, not
    found cached, or too unreliable to keep."""
    fit = cpu_attention_fit(step)
    return None if fit is None or fit.pair_s is None else max(0.0, fit.pair_s)


def predict_cpu(m: ModelSpec, cores: int, *, prompt: int, gen: int, concurrency: int,
                step_overhead_s: float = CPU_STEP_OVERHEAD_S,
                prefill: CpuPrefill | None = None, seq_s: float = 0.0) -> Prediction:
    """The CPU engine, one replica: the same roofline with DRAM and AVX rates, plus the
    engine's step overhead; where `probe --measure` timed the served engine here, its step,
    its time to first token and this CPU's measured rate instead of the assumed ones, and a
    step at many streams its cost per sequence more (``seq_s``, cpu_sequence_s)."""
    weights = streamed_weight_bytes(m, 1)
    over = step_overhead_s
    flops = prefill.flops_s if prefill else None
    # the prompt's tokens through the layers and its one sampled position through the LM head
    if prefill is None:
        ttft = cpu_forward_s(forward_flops(m, prompt, 1), weights, cores) + over
    else:
        ttft = prefill.first_token_s + cpu_forward_s(forward_flops(m, prompt, 1), weights,
                                                     cores, flops)
    tpot = cpu_forward_s(forward_flops(m, 1, 1), weights, cores, flops_s=flops) + over
    batch = max(1, concurrency)
    step = (cpu_forward_s(forward_flops(m, batch, batch), weights, cores, flops) + over
            + (batch - 1) * seq_s)
    cycle = batch * ttft + gen * step
    return Prediction(
        prompt / ttft, 1 / tpot, batch * gen / cycle, ttft, ttft + (gen - 1) * tpot, batch
    )
