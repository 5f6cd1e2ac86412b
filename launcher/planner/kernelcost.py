"""Predictions from a measured kernel table: a model's step shape, its step cost, and the
scheduler simulation over the requested workload. Pure.

:func:`step_shape` says which operations one TP rank of a model runs (what `probe --measure
--model` times); :func:`step_cost` turns the timed table into a :class:`TableStep` (a
:class:`~launcher.planner.schedsim.TableStepCost`): per decoder layer the linear layers, two
norms, the rotary products and the activation (or the routed experts) at each timed token
count, times the layers, plus two all-reduces a layer under TP over the group's link; a prompt
chunk's attention read off the timed points by its (query, key) pairs (whole prompts, and on a
GPU chunks after a cached prefix); a decoder's off the timed decode points as a line in the
keys each layer reads, its kernel's fixed cost and then per key (:func:`decode_groups`); the
LM head and sampler per sampled row; and the engine's own fixed cost of a step, measured where
the table has it, else the cost model's assumption (said in ``sources``). :func:`predict` then
runs :mod:`launcher.planner.schedsim` for one prompt (prefill, time to first token), one stream
(decode) and ``concurrency`` streams (throughput, TTFT and TPOT percentiles).

Approximations, each stated: latent attention's projections are taken at the per-head sizes
(vLLM runs q_a/q_b/kv_a/kv_b), a sliding-window layer's decode attention reads min(context,
window x sequences) keys of the step's summed context (exact where the sequences are all on
one side of the window), and pipeline parallelism is left to the roofline (the planner uses
this only for ``pp == 1``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.model import families
from launcher.model.mla import MlaDims
from launcher.model.modelspec import KvGroup, ModelSpec
from launcher.planner import hardware, memfit
from launcher.planner.asyncsched import vllm_async_scheduling
from launcher.planner.costmodel import (
    CpuStepOverhead,
    Layout,
    Prediction,
    Span,
    causal_pairs,
    graph_kernel_s,
    layer_host,
    moe_layers,
    request_host_s,
)
from launcher.planner.cudagraphs import EAGER, CudaGraphs, default_sizes
from launcher.planner.hardware import HostProfile, LayerHost
from launcher.planner.memfit import (
    BLOCK_TOKENS,
    CPU_BATCHED_TOKENS,
    CPU_BATCHES_IN_FLIGHT,
    CPU_BLOCK_TOKENS,
    GPU_BATCHES_IN_FLIGHT,
)
from launcher.planner.schedsim import (
    SchedulerLimits,
    SimError,
    SimResult,
    StepBatch,
    StepTimer,
    TableStepCost,
    Workload,
    measured_curve,
    reads_spans,
    simulate,
)
from launcher.planner.tablegaps import roofline_filled
from launcher.probe.kernels import (
    FLASH_PREFILL_NOTE,
    MLP_LINEARS,
    Attention,
    KernelTable,
    KernelTime,
    Linear,
    Moe,
    StepShape,
)

ACT_BYTES = 2


def _bits(m: ModelSpec) -> int:
    if m.quantization in ("awq", "gptq") or (m.quantization and m.weight_bits <= 4):
        return 4
    if m.quantization and m.weight_bits <= 8:
        return 8
    return 16


def step_shape(m: ModelSpec, tp: int = 1) -> StepShape:
    """The operations one TP rank runs for one forward step of ``m``."""
    h, d, bits = m.hidden_size, m.head_dim, _bits(m)
    heads = max(1, m.num_heads // tp)
    kv = max(1, m.num_kv_heads // tp)  # past tp = kv heads vLLM replicates them
    mla = m.mla if any(g.latent for g in m.kv_groups) else None
    linears = ([Linear("qkv", h, (heads + 2 * kv) * d, bits), Linear("o", heads * d, h, bits)]
               if mla is None else _mla_linears(mla, h, heads, bits))
    moe = None
    if m.num_experts:
        inter = max(1, (m.moe_intermediate_size or m.intermediate_size) // tp)
        routed = moe_layers(m)
        moe = Moe(routed, m.num_experts, max(1, min(m.experts_per_token, m.num_experts)), inter)
        # what vLLM runs beside the routed experts, as plain GEMMs: the shared experts' MLP in
        # every MoE layer, a dense MLP in the dense ones (DeepSeek's first layer: 10,944 wide)
        # (the tenth and eleventh H200 tables: without them GLM-4.7-Flash and DeepSeek-V2-Lite
        # decoded 15% faster in plan than served, Qwen3-30B-A3B, with neither, +3%)
        if m.shared_expert_intermediate_size:
            shared = max(1, m.shared_expert_intermediate_size // tp)
            linears += [Linear("shared_gate_up", h, 2 * shared, bits, routed),
                        Linear("shared_down", shared, h, bits, routed)]
        if m.dense_mlp_layers and m.intermediate_size:
            dense = max(1, m.intermediate_size // tp)
            linears += [Linear("dense_gate_up", h, 2 * dense, bits, m.dense_mlp_layers),
                        Linear("dense_down", dense, h, bits, m.dense_mlp_layers)]
    else:
        inter = max(1, m.intermediate_size // tp)
        linears += [Linear("gate_up", h, 2 * inter, bits), Linear("down", inter, h, bits)]
    attention = tuple(
        Attention(g.layers, heads, 1 if g.latent else max(1, g.kv_heads // tp), g.head_dim,
                  g.window, g.latent, chunked=g.chunked and bool(g.window))
        if not (g.latent and mla) else
        Attention(g.layers, heads, 1, mla.latent_dim, g.window, True, mla.qk_head_dim,
                  mla.v_head_dim, mla.kv_lora_rank)
        for g in m.kv_groups if g.layers
    ) or (Attention(m.num_layers, heads, kv, d),)
    dtype = m.dtype if m.dtype in ("bfloat16", "float16", "float32") else "bfloat16"
    return StepShape(m.name, m.num_layers, h, max(1, m.vocab_size // tp), tuple(linears),
                     attention, moe, dtype)


def _act_layers(s: StepShape) -> int:
    """Decoder layers that run a dense MLP's SiLU-and-mul (the probe times it at that MLP's
    width): every layer of a dense model; of a mixture of experts, its dense layers and, where
    it has shared experts, its MoE layers too (the routed experts' is inside the fused op)."""
    if s.moe is None:
        return s.layers
    names = {lin.name: lin.layers for lin in s.linears}
    return (names.get("dense_gate_up", 0)
            + (s.moe.layers if "shared_gate_up" in names else 0))


def _mla_linears(mla: MlaDims, hidden: int, heads: int, bits: int) -> list[Linear]:
    """Latent attention's projections on one TP rank, as vLLM's DeepseekV2 attention has them
    (launcher.model.mla): the query (``q``, or with a query LoRA ``q_a`` fused with ``kv_a``
    into one replicated GEMM, then ``q_b``), ``kv_a`` (hidden -> the cached latent, replicated
    on every rank), ``kv_b`` (latent -> each head's nope K and V; in a decode step the W_UK and
    W_UV bmms read the same weights for the same FLOPs a token) and ``o``."""
    latent, qk = mla.latent_dim, mla.qk_head_dim
    query = ([Linear("q_a_kv_a", hidden, mla.q_lora_rank + latent, bits),
              Linear("q_b", mla.q_lora_rank, heads * qk, bits)] if mla.q_lora_rank else
             [Linear("q", hidden, heads * qk, bits), Linear("kv_a", hidden, latent, bits)])
    return [*query, Linear("kv_b", mla.kv_lora_rank, heads * (mla.qk_nope_head_dim
                                                              + mla.v_head_dim), bits),
            Linear("o", heads * mla.v_head_dim, hidden, bits)]


@dataclass(frozen=True)
class AllReduce:
    """The TP group's all-reduce: ``ranks`` GPUs, ``latency_s`` + bytes at ``bytes_s``."""

    ranks: int = 1
    latency_s: float = 0.0
    bytes_s: float = float("inf")

    def seconds(self, nbytes: float) -> float:
        if self.ranks <= 1:
            return 0.0
        return self.latency_s + 2 * (self.ranks - 1) / self.ranks * nbytes / self.bytes_s


@dataclass(frozen=True)
class KernelCost:
    cost: TableStep
    sources: tuple[str, ...]  # what was measured, what assumed: for the plan's reasons
    # the engine core's own work a step (measured or assumed); in ``cost``'s steps unless
    # step_cost was asked to leave it beside them (overlap_overhead)
    overhead_s: float = 0.0


def _at(points: list[KernelTime], tokens: int) -> float:
    """Time at ``tokens`` from the timed points (linear between them, in proportion past)."""
    if not points:
        return 0.0
    cost = TableStepCost(tuple(p.tokens for p in points), tuple(p.seconds for p in points))
    return cost.forward(tokens)


@dataclass(frozen=True)
class DecodeGroup:
    """One group of decoder layers' decode attention as the table timed it: a line in the keys
    its kernel reads, ``fixed_s`` a layer for the kernel itself in any step with decoders and
    ``key_s`` per cached key a sequence reads: its whole context, or where the layers slide at
    most ``window`` keys of it."""

    layers: int
    fixed_s: float
    key_s: float
    window: int | None = None
    chunked: bool = False  # ``window`` is a chunk of chunked attention (Llama 4's)

    def seconds(self, seqs: int, context: int, *, alone: bool = True,
                chunk_keys: int | None = None) -> float:
        """The group's attention for ``seqs`` decoders of ``context`` cached tokens in all,
        with its kernel's fixed cost where they are ``alone`` in the step: beside prompt
        chunks vLLM runs them in the chunks' one attention call a layer, whose fixed cost is
        in the chunks' timed time. A sliding layer reads min(context, window) keys of each
        sequence; from the sum it is taken as min(context, window x seqs), exact where every
        sequence's context is on the same side of the window (a step's usually are: one
        workload's lengths). A chunked layer reads each decoder's own chunk up to its new
        token: ``chunk_keys``, their sum from the decoders' positions (:class:`TableStep`);
        without them at most a chunk each, as a sliding layer."""
        if seqs <= 0:
            return 0.0
        if self.chunked and chunk_keys is not None:
            keys = chunk_keys
        else:
            keys = context if self.window is None else min(context, self.window * seqs)
        return self.layers * ((self.fixed_s if alone else 0.0) + self.key_s * keys)


@dataclass(frozen=True)
class TableStep(TableStepCost):
    """A kernel table's step: :class:`schedsim.TableStepCost`'s terms (its per-token decode
    attention left at 0) with the decoders' attention read off the table's timed decode points
    (:func:`decode_groups`): each layer's kernel a fixed cost in every step of decoders alone
    (beside prompt chunks the chunks' timed call holds it), and the keys it reads, capped at a
    sliding layer's window.

    A model with chunked-attention layers (Llama 4's; ``chunk`` their chunk) has those layers'
    prompt-chunk attention apart (``chunk_prefill_pairs`` / ``chunk_prefill_s``: their timed
    points at the pairs each read, a query its own chunk's prefix) and reads the requests'
    positions (a :class:`schedsim.SpanTimer`): a chunk's queries at their chunk's pairs, each
    decoder at its own chunk's keys (:meth:`KvGroup.pairs`, the one rule), which no total of
    contexts gives; the other layers as before, off the step's totals."""

    decode: tuple[DecodeGroup, ...] = ()
    chunk: int = 0
    chunk_prefill_pairs: tuple[float, ...] = ()
    chunk_prefill_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        xs = self.chunk_prefill_pairs
        if len(xs) != len(self.chunk_prefill_s) or list(xs) != sorted(set(xs)) or (
                xs and xs[0] <= 0) or not all(math.isfinite(v) and v >= 0
                                              for v in (*xs, *self.chunk_prefill_s)):
            raise SimError("a chunked layers' attention curve needs one time per pair count, "
                           "counts positive and ascending")

    @property
    def reads_spans(self) -> bool:
        return self.chunk > 0

    def _chunked(self) -> KvGroup:
        return KvGroup(1, 1, 1, self.chunk, chunked=True)

    def _split(self, batch: StepBatch) -> tuple[Sequence[Span], Sequence[Span]] | None:
        """The step's prompt chunks' spans and its decoders' (schedsim lists them in that
        order); None where the step carries none."""
        if not batch.spans:
            return None
        cut = len(batch.spans) - batch.decode_seqs
        return batch.spans[:cut], batch.spans[cut:]

    def chunk_attention(self, batch: StepBatch) -> float:
        """The chunked layers' prompt-chunk attention: their timed curve at the pairs the
        chunks' queries read (without positions: at most a chunk a query)."""
        if not self.chunk or not batch.prefill_tokens or not self.chunk_prefill_pairs:
            return 0.0
        split = self._split(batch)
        if split is None:
            pairs = min(batch.prefill_pairs, float(batch.prefill_tokens * self.chunk))
        else:
            g = self._chunked()
            pairs = float(sum(g.pairs(a, b) for a, b in split[0]))
        return measured_curve(self.chunk_prefill_pairs, self.chunk_prefill_s, pairs)

    def decode_attention(self, batch: StepBatch) -> float:
        alone = batch.prefill_tokens == 0
        split = self._split(batch) if self.chunk else None
        keys = None if split is None else sum(self._chunked().keys(a) for a, _ in split[1])
        return sum(g.seconds(batch.decode_seqs, batch.decode_context, alone=alone,
                             chunk_keys=keys)
                   for g in self.decode)

    def step_s(self, batch: StepBatch) -> float:
        return (super().step_s(batch) + self.chunk_attention(batch)
                + self.decode_attention(batch))


def _line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(fixed, per key) of the line through the fewest and the most keys of ``points`` (keys,
    seconds); None where they all read as many keys."""
    lo, hi = min(points), max(points)
    if hi[0] <= lo[0]:
        return None
    per = max(0.0, (hi[1] - lo[1]) / (hi[0] - lo[0]))
    fixed = lo[1] - per * lo[0]
    return (fixed, per) if fixed >= 0 else (0.0, hi[1] / hi[0])


def decode_groups(table: KernelTable) -> tuple[DecodeGroup, ...]:
    """Each attention group's decode attention from its timed points (``DECODE_BATCH``
    sequences at each of ``DECODE_CONTEXTS``): the line through them in the keys the kernel
    read (a sequence's context, at most its window), whose intercept is the kernel's own fixed
    cost a step. Read through the origin at the largest point instead (context tokens only),
    as before issue 22's twelfth table, it left that cost out of every decode step: 8-15 us a
    layer on the H200's tables, 0.3-0.7 ms a step for 34-48 layers; and a sliding layer timed
    at its window but charged per context token at the largest context (8,192 over a
    1,024-token window) was charged an eighth of the keys it reads below its window (Gemma-3-12B:
    single-stream decode +10% fast in plan, 32 streams +15%, where the roofline, which charges
    every kernel and byte, came within 1%). A group whose points all read its window (it slides
    within the smallest timed context) takes the per-key cost of a group of the same kernel
    (query and KV heads, head dim) that has a line, the rest of its time fixed; where there is
    none, its time per key read, no fixed part."""
    s = table.shape
    points: list[list[tuple[float, float]]] = []
    for g, a in enumerate(s.attention):
        timed = table.lookup("attn:decode", g)
        points.append([(t.tokens * a.decode_keys(t.context), t.seconds)
                       for t in timed if t.tokens > 0 and t.context > 0])
    lines = [_line(p) if p else None for p in points]

    def kernel(a: Attention) -> tuple[int, int, int, bool]:
        return a.heads, a.kv_heads, a.head_dim, a.latent

    out = []
    for g, a in enumerate(s.attention):
        if not points[g]:
            continue
        line = lines[g]
        if line is None:
            keys = points[g][0][0]
            spent = statistics.median(t for _, t in points[g])
            per = next((ln[1] for h, ln in zip(s.attention, lines, strict=True)
                        if ln is not None and kernel(h) == kernel(a)), None)
            per = spent / keys if per is None else min(per, spent / keys)
            line = (max(0.0, spent - per * keys), per)  # rounding: never below 0
        out.append(DecodeGroup(a.layers, line[0], line[1], a.window, a.chunked))
    return tuple(out)


def _prefill_points(timed: list[KernelTime], a: Attention | None = None
                    ) -> list[tuple[float, float]]:
    """A prompt chunk's attention as timed: (its causal (query, key) pairs, seconds) per point,
    ascending. A point of ``tokens`` new tokens over ``context`` keys is a chunk after
    ``context - tokens`` cached ones (a whole prompt where the two are equal). A chunked
    layer's (``a``) at the pairs its queries read, each its own chunk's prefix (a chunk
    after a whole attention chunk reads that chunk's triangle, as at depth 0). One time per
    pair count: the median of any repeated."""
    chunked = (KvGroup(1, 1, 1, a.window, chunked=True)
               if a is not None and a.chunked and a.window else None)
    by: dict[float, list[float]] = {}
    for t in timed:
        depth = max(0, t.context - t.tokens)
        x = (causal_pairs(t.tokens, depth) if chunked is None
             else float(chunked.pairs(depth, depth + t.tokens)))
        by.setdefault(x, []).append(t.seconds)
    return [(x, statistics.median(by[x])) for x in sorted(by) if x > 0]


def _fixed_and_per_token(timed: list[KernelTime]) -> tuple[float, float]:
    """(fixed, per token) of an op from its timed points (two or more, ascending in tokens, as
    KernelTable.lookup gives them): the line through the fewest and the most tokens, neither
    part below 0 (a table whose points share one token count: the difference per token)."""
    lo, hi = timed[0], timed[-1]
    per = max(0.0, (hi.seconds - lo.seconds) / max(1, hi.tokens - lo.tokens))
    return max(0.0, lo.seconds - per * lo.tokens), per


def rope_width(s: StepShape) -> int:
    """The elements a token's rotary embedding reads and writes on one TP rank: every query and
    key head's (vLLM rotates both), or under latent attention the rope dims of each query head
    and of the one shared latent key (as the probe's rope is timed)."""
    a = s.attention[0] if s.attention else None
    if a is None:
        return s.hidden
    if a.latent and a.qk_dim and a.rank:
        return (a.heads + 1) * (a.head_dim - a.rank)
    return (a.heads + a.kv_heads) * a.head_dim


def fused_rope_s(table: KernelTable, tokens: int, prefix: str = "") -> float:
    """One layer's rotary embedding at ``tokens`` as the served engine runs it: ONE kernel.
    On a GPU vLLM compiles its model with Inductor and its custom ops off (``custom_ops``
    'none' under the inductor backend, vllm/config/vllm.py 0.26 as 0.32; the rope fusion
    passes are ROCm-only), so the rotary runs as ``RotaryEmbedding.forward_native`` fused into
    one element-wise kernel over the query and key heads, in and past the CUDA graphs alike.
    The table's ``rope`` is an eager torch chain (cat, neg, two products, a sum: five kernels
    over the query heads), which at a prompt chunk's 8,192 tokens costs several times that
    (issue 22's thirteenth table: 269 us a layer for Gemma-3-12B, where its 201 MB of query
    and key bytes in and out take 62 us at the rate the table's norm moves bytes). Costed
    here as that element-wise kernel is costed by the table's own norm, timed the same way
    (``prefix``: graph-replayed or eager): the norm's fixed cost (its time at the fewest timed
    tokens, less their bytes) plus the rope's bytes at the norm's rate per byte (a norm reads
    and writes ``hidden`` elements a token, the rope :func:`rope_width`). Never more than the
    timed chain; the timed chain where the table has no norm.

    :func:`step_cost` charges it to the steps past the CUDA graphs (the table's ``eager:``
    figures: the long prompt chunks the measured 16k first tokens check; the 22 16k TTFTs of
    tables 8-13 replayed: mean |error| 11.6% -> 9.8%, Gemma-3-12B +11% -> +8% (t12 +9 -> +6),
    Qwen2.5-1.5B +8% -> +4%, the MoEs' single prompts now 3-4% fast, Qwen3-0.6B's 0 -> -7%).
    Within the graphs the timed chain stays: the same fusion there moved the twelfth table's
    measured single-stream decode of Gemma-3-12B 5.4% fast and four dense decode figures
    3-6% faster than served, so something else in a replayed decode step is under-charged
    that the chain's extra kernels now stand in for (not found here)."""
    timed = _at(table.lookup(prefix + "rope"), tokens)
    norm = table.lookup(prefix + "norm")
    if len(norm) < 2 or tokens <= 0:
        return timed
    fixed, per_token = _fixed_and_per_token(norm)
    scale = rope_width(table.shape) / max(1, table.shape.hidden)
    return min(timed, fixed + per_token * scale * tokens) if timed else timed


def step_cost(
    table: KernelTable,
    *,
    allreduce: AllReduce = AllReduce(),
    assumed_step_overhead_s: float,
    max_graph_tokens: int = 0,
    measured_step_overhead: tuple[float, str] | None = None,
    overlap_overhead: bool = False,
    untimed_kernels: tuple[int, float] = (0, 0.0),
) -> KernelCost:
    """The step cost the table gives, with the engine's step overhead measured (in the table,
    or timed on this machine by `probe --measure`: seconds and the line saying so) or assumed.
    The GPU's work only: the serving host's launching of a step's layers (past the graphs one
    kernel at a time, from Python) bounds the whole step, attention included, in
    :class:`HostBound`. ``max_graph_tokens``: the largest step the engine replays from CUDA
    graphs (0: none, every step eager; a GPU layout's is its ``Layout.graphs``, which
    :func:`layout_step` passes).
    ``overlap_overhead``: the engine's step overhead runs beside the GPU's step (vLLM's
    asynchronous scheduling on a GPU prepares step k+1 while the GPU runs step k), so it is
    left out of the steps and returned as ``overhead_s`` for :class:`HostBound` to bound them
    with; else (the CPU engine) it is in series.
    ``untimed_kernels``: (kernels a step runs that no timed op holds, the fixed seconds each
    costs in a CUDA-graph replay): added to every step (:func:`untimed_layer_kernels`)."""
    s = table.shape
    ladder = sorted({t.tokens for t in table.times if t.op == "norm"})
    if not ladder:
        raise ValueError("the kernel table holds no per-token operations")
    # each op with the decoder layers that run it (a linear's own count where it has one)
    layer_ops = [(f"linear:{lin.name}", lin.layers or s.layers) for lin in s.linears]
    layer_ops += [("norm", s.layers), ("norm", s.layers), ("act", _act_layers(s))]
    eager = any(t.op.startswith("eager:") for t in table.times)

    untimed_s = untimed_kernels[0] * untimed_kernels[1]

    def forward_at(n: int, prefix: str) -> float:
        layer = sum(k * _at(table.lookup(prefix + op), n) for op, k in layer_ops)
        # the rotary: past the graphs as the compiled step's one fused kernel (fused_rope_s);
        # within them as timed
        layer += s.layers * (fused_rope_s(table, n, prefix) if prefix
                             else _at(table.lookup("rope"), n))
        moe = _at(table.lookup(prefix + "moe"), n) * (s.moe.layers if s.moe else 0)
        comm = 2 * s.layers * allreduce.seconds(n * s.hidden * ACT_BYTES)
        return layer + moe + comm + untimed_s

    forward = [forward_at(n, "") for n in ladder]
    # past the graphs: the eager timings where the table has them (else the graph-replayed
    # ones). They come from a tight loop, which launches far faster than vLLM's compiled
    # pieces do from Python: HostBound bounds such a step by the host's launching of it.
    eager_forward = [forward_at(n, "eager:") for n in ladder] if eager else []
    pair = 0.0
    curves = []
    chunked_curves = []  # chunked layers' (Llama 4's): read at their own pairs (TableStep)
    for g, a in enumerate(s.attention):
        pre = _prefill_points(table.lookup("attn:prefill", g), a)
        if pre and a.chunked:
            chunked_curves.append((a.layers, pre))
        elif pre:
            curves.append((a.layers, pre))
            pair += a.layers * pre[-1][1] / pre[-1][0]
    decode = decode_groups(table)
    head = table.lookup("head")
    per_row = fixed_head = 0.0
    if len(head) >= 2:
        fixed_head, per_row = _fixed_and_per_token(head)
    elif head:
        per_row = head[0].seconds
    # the layers' prompt-chunk attention as measured at each timed (query, key) pair count
    xs, ys = _summed_curve(curves)
    chunk_xs, chunk_ys = _summed_curve(chunked_curves)
    chunk = next((a.window or 0 for a in s.attention if a.chunked), 0)
    sources = [f"kernels measured {table.measured_at} ({table.method}) on {table.key.device}"]
    if table.engine_step_s is not None:
        overhead = table.engine_step_s
        sources.append(f"engine step overhead measured: {overhead * 1e3:.2f} ms")
    elif measured_step_overhead is not None:
        overhead, why = measured_step_overhead
        sources.append(why)
    else:
        overhead = assumed_step_overhead_s
        sources.append(f"engine step overhead assumed: {overhead * 1e3:.2f} ms (not measured)")
    if overlap_overhead:
        sources[-1] += (", beside the GPU's step (asynchronous scheduling): a step lasts the "
                        "longer of the two")
    if xs:
        kernel = ("vLLM's FlashAttention" if FLASH_PREFILL_NOTE in table.notes
                  else "torch's SDPA, not the engine's FlashAttention")
        sources.append(f"prompt-chunk attention read off {len(xs)} timed points up to "
                       f"{xs[-1]:,.0f} (query, key) pairs ({kernel}), in proportion past them")
    if chunk:
        sources.append(f"chunked-attention layers ({chunk:,}-token chunks) timed and read at "
                       f"each query's own chunk's keys, as vLLM cuts a step at the chunks")
    if decode:
        fixed = sum(d.layers * d.fixed_s for d in decode)
        sources.append(f"decoders' attention read off the timed points as a line in the keys "
                       f"each layer reads (a sliding layer's capped at its window): "
                       f"{fixed * 1e6:.0f} us of its kernels' own a step")
    if untimed_s:
        sources.append(f"{untimed_kernels[0]} kernels a step that no timed op holds (the "
                       f"family's kernels a layer less the ops timed: the KV-cache write and "
                       f"the like) at {untimed_kernels[1] * 1e6:.2f} us each, a CUDA-graph "
                       f"kernel's fixed cost")
    sources += [f"not in the table: {x}" for x in table.missing]
    cost = TableStep(tuple(ladder), tuple(forward), pair, 0.0, per_row,
                     (0.0 if overlap_overhead else overhead) + fixed_head,
                     tuple(eager_forward), max_graph_tokens, tuple(xs), tuple(ys), decode,
                     chunk if chunked_curves or any(d.chunked for d in decode) else 0,
                     tuple(chunk_xs), tuple(chunk_ys))
    return KernelCost(cost, tuple(sources), overhead)


def _summed_curve(curves: list[tuple[int, list[tuple[float, float]]]]
                  ) -> tuple[list[float], list[float]]:
    """Layer groups' prompt-chunk attention summed at each of their timed pair counts (each
    group ``layers`` x its curve there)."""
    xs = sorted({x for _, pts in curves for x, _ in pts})
    ys = [sum(layers * measured_curve([p for p, _ in pts], [t for _, t in pts], x)
              for layers, pts in curves) for x in xs]
    return xs, ys


@dataclass(frozen=True)
class HostBound:
    """The table's step, never shorter than the serving host's front end needs for the
    sequences that sample in it (:class:`hardware.HostProfile`): the roofline's rule
    (costmodel.decode_step_s), so a kernel table and the roofline share one host model. The
    CPU engine's steps are not wrapped: there the host is the engine, and its measured step
    overhead is already in the table's step. ``engine_s``: the engine core's own work a step,
    done beside the GPU's under asynchronous scheduling, which bounds the step the same way."""

    cost: TableStepCost
    host: HostProfile
    engine_s: float = 0.0
    layers: int = 0  # the model's, whose eager steps the host launches layer by layer
    # the served engine's graphs; None: vLLM's default sizes up to the table's range
    # (``cost.max_graph_tokens``)
    graphs: CudaGraphs | None = None
    # the model's host work a layer, eager and in piecewise graphs (costmodel.layer_host: the
    # roofline's figure, family extras and all); None: the host profile's reference layer
    layer: LayerHost | None = None
    # vLLM's KV-cache groups for the model (memfit.vllm_group_count): the engine's bookkeeping
    # a running sequence a step grows with them (hardware.HostProfile.step_floor_s)
    kv_groups: int = 1

    @property
    def layer_host(self) -> LayerHost:
        return self.layer if self.layer is not None else self.host.reference_layer

    @property
    def reads_spans(self) -> bool:
        """Whether the table's step reads the requests' positions (chunked layers: TableStep)."""
        return reads_spans(self.cost)

    @property
    def served(self) -> CudaGraphs:
        """The graphs this timer's steps run under (one rule: launcher.planner.cudagraphs)."""
        if self.graphs is not None:
            return self.graphs
        return CudaGraphs(default_sizes(self.cost.max_graph_tokens))

    def step_s(self, batch: StepBatch) -> float:
        """The table's step, padded to the captured size within the graphs' range (the GEMMs
        and the rest of ``forward`` run the padded rows; attention the real ones), and no
        shorter than the front end's work, the engine core's, or, in an eager or
        piecewise-graph step, the host's launching of its layers: past the graphs one kernel
        at a time from Python, within them the pieces' replays with the attention between
        them (the roofline's per-layer floor: :attr:`layer_host`, costmodel.layer_host).
        That launching bounds the whole step, its attention included: the host launches
        ahead of the GPU, so while the GPU runs a long prompt chunk's attention the host
        launches the next layer's kernels, and a step lasts the longer of the two, not the
        host's launching with the attention after it (the roofline's prompt layer likewise
        lasts the longer of its GPU work, attention and all, and the host's:
        costmodel._prefill_layer_parts)."""
        graphs, tokens = self.served, batch.tokens
        mode = graphs.mode(batch.prefill_tokens, tokens)
        gpu = self.cost.step_s(batch)
        if mode != "eager":
            gpu += self.cost.forward(graphs.padded(tokens)) - self.cost.forward(tokens)
        # an eager or piecewise step's host work is its launch: the engine core's own work a
        # step and the layers' launches (eager kernels, or the pieces' replays with the
        # attention between them), all in the engine core's thread while the GPU runs what it
        # was given; the engine core's own work grows with every extra KV-cache group, a step
        # and a prompt block (the same LayerHost figure)
        launch = self.launch_s(batch) if mode != "full" else 0.0
        engine = self.engine_s + self.layer_host.kv_groups_s(batch.prefill_tokens)
        return max(gpu, self.host.step_floor_s(batch.sampled, self.kv_groups), engine, launch)

    def launch_s(self, batch: StepBatch) -> float:
        """The host's launching of the step (a :class:`schedsim.LaunchTimer`), as the
        roofline's (:meth:`LayerHost.launch_s` of the same layer figure, under the same
        graphs): past the range eagerly, layer by layer, decoders only or not; within it a
        decode step's full graph at once, a prompt step's pieces with the attention between
        them."""
        return self.layer_host.launch_s(self.layers, self.served, batch.prefill_tokens,
                                        batch.tokens)

    def idle_start_s(self) -> float:
        """The engine core's own work, in series before an idle engine's first step (the
        roofline pays LayerHost.engine_step_s in every prefill step:
        costmodel._prefill_layers_s), its extra KV-cache groups' fixed part with it."""
        return self.engine_s + self.layer_host.kv_groups_s(0)


def _timer(
    m: ModelSpec,
    table: KernelTable,
    *,
    allreduce: AllReduce,
    assumed_step_overhead_s: float,
    graphs: CudaGraphs,
    measured_step_overhead: tuple[float, str] | None = None,
    host: HostProfile | None = None,
    kernel_s: float = 0.0,
) -> tuple[StepTimer, tuple[str, ...]]:
    """The step timer a table gives (and its sources): where ``host`` is a GPU server's, eager
    steps launched at its pace for ``m`` (costmodel.layer_host, the roofline's figure),
    steps within the served engine's ``graphs`` padded and run as those graphs run them
    (:class:`HostBound`), and every step bound by its front end; the CPU engine's (``host``
    None) as timed. The one constructor of a table's steps. ``kernel_s``: the GPU's fixed cost
    of a kernel in a CUDA-graph replay (costmodel.graph_kernel_s), which each kernel the table
    does not time costs a step (0: none charged, the CPU engine's)."""
    layer = layer_host(m, host) if host is not None else None
    untimed = untimed_layer_kernels(m, table.shape) * table.shape.layers
    kc = step_cost(table, allreduce=allreduce, assumed_step_overhead_s=assumed_step_overhead_s,
                   max_graph_tokens=graphs.max_tokens,
                   measured_step_overhead=measured_step_overhead,
                   overlap_overhead=host is not None, untimed_kernels=(untimed, kernel_s))
    if host is None:
        return kc.cost, kc.sources
    return HostBound(kc.cost, host, kc.overhead_s, m.num_layers, graphs, layer,
                     memfit.vllm_group_count(m)), (*kc.sources, graphs.source)


def untimed_layer_kernels(m: ModelSpec, s: StepShape) -> int:
    """Kernels one decoder layer of ``m`` runs that no op of its step shape ``s`` times: the
    family's count for a dense layer (families.eager_layer_kernels, counted from vLLM's own
    model classes) less the ops timed a layer (the attention's projections, two norms, the
    rotary, the attention, and a dense MLP's families.DENSE_MLP_KERNELS; a mixture-of-experts
    layer swaps those three for the fused-MoE op in both counts). Llama's layer leaves one,
    the KV-cache write; Gemma 3's two (its third norm). The eleventh H200 table's kernel-table
    decode ran +25% fast for Gemma-3-4B, whose roofline, which charges every counted kernel
    (costmodel.decode_step_s), came within 2%."""
    projections = sum(1 for lin in s.linears if lin.name not in MLP_LINEARS)
    timed = projections + 2 + 1 + 1 + families.DENSE_MLP_KERNELS  # norms, rotary, attention
    return max(0, families.eager_layer_kernels(m.family) - timed)


def _tp_allreduce(lay: Layout) -> AllReduce:
    link = lay.tp_link
    return AllReduce(lay.tp, link.latency_s, link.gbs * 1e9) if lay.tp > 1 else AllReduce()


def layout_step(m: ModelSpec, table: KernelTable, lay: Layout, *,
                max_graph_tokens: int | None = None) -> StepTimer:
    """The step timer of a GPU layout's kernel table (over its TP link, under the served
    engine's CUDA graphs ``lay.graphs``, on its host): what :func:`layout_prediction` predicts
    with, for the load and agent simulations to time the same steps. ``max_graph_tokens``
    (callers that hold the range as a number): vLLM's default sizes up to it instead."""
    table = roofline_filled(m, table, lay)  # ops the table lacks: the roofline's figures
    graphs = (lay.graphs if max_graph_tokens is None
              else CudaGraphs(default_sizes(max_graph_tokens)))
    timer, _ = _timer(m, table, allreduce=_tp_allreduce(lay),
                      assumed_step_overhead_s=hardware.STEP_OVERHEAD_S, graphs=graphs,
                      host=lay.host, kernel_s=graph_kernel_s(lay.gpus))
    return timer



@dataclass(frozen=True)
class LoadPrediction:
    """Figures as loadgen reports them, from the simulated scheduler."""

    prefill_tok_s: float  # one prompt: prompt / TTFT
    decode_tok_s: float  # one stream: 1 / TPOT
    throughput_tok_s: float  # generated tok/s of ``concurrency`` streams
    ttft_s: float
    load: SimResult  # the ``concurrency``-stream run: percentiles per request


def predict(
    cost: StepTimer,
    lim: SchedulerLimits,
    *,
    prompt: int,
    gen: int,
    concurrency: int,
    request_overhead_s: float,
) -> LoadPrediction:
    single = simulate(lim, cost, Workload(prompt, gen), request_overhead_s=request_overhead_s)
    many = simulate(lim, cost, Workload(prompt, gen, concurrency=concurrency),
                    request_overhead_s=request_overhead_s)
    (one,) = single.requests
    return LoadPrediction(prompt / one.ttft_s, 1 / one.tpot_s if one.tpot_s else 0.0,
                          many.output_tok_s, one.ttft_s, many)


def as_prediction(
    m: ModelSpec,
    table: KernelTable,
    *,
    kv_bytes: float,
    block: int,
    batched_tokens: int,
    max_num_seqs: int,
    prompt: int,
    gen: int,
    concurrency: int,
    assumed_step_overhead_s: float,
    request_overhead_s: float,
    allreduce: AllReduce = AllReduce(),
    dp: int = 1,
    graphs: CudaGraphs = EAGER,
    measured_step_overhead: tuple[float, str] | None = None,
    kv_dtype_bytes: int = 2,
    in_flight: int = GPU_BATCHES_IN_FLIGHT,
    host: HostProfile | None = None,
    pp: int = 1,
    kernel_s: float = 0.0,
) -> tuple[Prediction, tuple[str, ...]]:
    """The cost model's :class:`Prediction` from a kernel table, through the simulated
    scheduler; ``dp`` replicas share the streams. With the sources said. The KV pool is
    memfit's (:func:`memfit.pool_blocks` of ``kv_bytes``, counted in the simulation's blocks
    for a request of ``prompt + gen``: sliding windows and block rounding as vLLM counts
    them). With ``host`` (a GPU server's), no step is shorter than its front end's work.
    ``graphs``: the served engine's CUDA graphs (a GPU layout's ``Layout.graphs``; none on the
    CPU engine). The engine schedules asynchronously where vLLM does by default
    (:func:`asyncsched.vllm_async_scheduling` of a GPU server, ``host``, of ``pp`` stages: the
    one rule of the load and agent simulations too). ``kernel_s``: a GPU's fixed cost of a
    graph kernel, charged to the kernels the table does not time (:func:`_timer`)."""
    timer, sources = _timer(m, table, allreduce=allreduce,
                            assumed_step_overhead_s=assumed_step_overhead_s, graphs=graphs,
                            measured_step_overhead=measured_step_overhead, host=host,
                            kernel_s=kernel_s)
    per_replica = max(1, -(-concurrency // max(1, dp)))
    pool = memfit.pool_blocks(m, kv_bytes, kv_dtype_bytes, block)
    blocks = memfit.scheduler_blocks(m, pool, prompt + gen, batched_tokens, kv_dtype_bytes,
                                     block, in_flight)
    lim = SchedulerLimits(batched_tokens, max_num_seqs, blocks, block,
                          async_scheduling=vllm_async_scheduling(gpu=host is not None, pp=pp))
    p = predict(timer, lim, prompt=prompt, gen=gen, concurrency=per_replica,
                request_overhead_s=request_overhead_s)
    busy = min(max(1, dp), -(-concurrency // per_replica))
    tpot = 1 / p.decode_tok_s if p.decode_tok_s else 0.0
    pred = Prediction(
        prefill_tok_s=p.prefill_tok_s,
        decode_tok_s=p.decode_tok_s,
        throughput_tok_s=busy * p.throughput_tok_s,
        ttft_s=p.ttft_s,
        e2e_s=p.ttft_s + (gen - 1) * tpot,
        batch=p.load.max_running,
    )
    return pred, sources


def table_for(
    tables: Sequence[KernelTable], m: ModelSpec, tp: int, device: str
) -> KernelTable | None:
    """The table timed for ``m`` at ``tp`` on a device called ``device``, if one was kept."""
    key = step_shape(m, tp).key()
    return next((t for t in tables if t.key.shape == key and t.key.device == device), None)


def layout_prediction(
    m: ModelSpec,
    tables: Sequence[KernelTable],
    lay: Layout,
    *,
    batched_tokens: int,
    max_num_seqs: int,
    prompt: int,
    gen: int,
    concurrency: int,
    kv_dtype_bytes: int = 2,
) -> tuple[Prediction, KernelTable] | None:
    """A GPU candidate's prediction from its kernel table, with the table; None where there is
    none (the roofline then predicts) or the layout has pipeline stages (left to the
    roofline). ``kv_dtype_bytes``: the fit's KV element size (1 under FP8 KV); the engine's
    CUDA graphs are the layout's (``lay.graphs``)."""
    names = {g.name for g in lay.gpus}
    if lay.pp != 1 or len(names) != 1:
        return None
    table = table_for(tables, m, lay.tp, names.pop())
    if table is None:
        return None
    table = roofline_filled(m, table, lay)  # ops the table lacks: the roofline's figures
    pred, _ = as_prediction(
        m, table, kv_bytes=lay.kv_budget_bytes, block=BLOCK_TOKENS, batched_tokens=batched_tokens,
        max_num_seqs=max_num_seqs, prompt=prompt, gen=gen, concurrency=concurrency,
        assumed_step_overhead_s=hardware.STEP_OVERHEAD_S,
        # the request's way in with its prompt's length, as the roofline and the load
        # simulation count it (costmodel.request_host_s)
        request_overhead_s=request_host_s(lay.host, prompt), allreduce=_tp_allreduce(lay),
        dp=lay.dp,
        kv_dtype_bytes=kv_dtype_bytes, host=lay.host, graphs=lay.graphs, pp=lay.pp,
        kernel_s=graph_kernel_s(lay.gpus),
    )
    return pred, table


def cpu_prediction(
    m: ModelSpec, tables: Sequence[KernelTable], *, kv_bytes: float, prompt: int, gen: int,
    concurrency: int, step_overhead: CpuStepOverhead | None = None,
) -> tuple[Prediction, tuple[str, ...]] | None:
    """The CPU engine's prediction from this CPU's kernel table; None without one. The
    engine's step overhead is the one `probe --measure` timed here, where it did."""
    table = next((t for t in tables if t.key.device.startswith("cpu:")
                  and t.key.shape == step_shape(m).key()), None)
    if table is None:
        return None
    return as_prediction(
        m, table, kv_bytes=kv_bytes, block=CPU_BLOCK_TOKENS, batched_tokens=CPU_BATCHED_TOKENS,
        max_num_seqs=256, prompt=prompt, gen=gen, concurrency=concurrency,
        assumed_step_overhead_s=hardware.CPU_STEP_OVERHEAD_S,
        measured_step_overhead=(step_overhead.seconds, step_overhead.why)
        if step_overhead is not None and step_overhead.measured else None,
        request_overhead_s=hardware.REQUEST_OVERHEAD_S, graphs=EAGER,
        in_flight=CPU_BATCHES_IN_FLIGHT,
    )
