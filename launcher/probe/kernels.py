"""A forward step's operations, timed on this machine: the kernel table the cost model reads.

A roofline with assumed efficiencies misses what dominates small and mid-size steps: fixed
per-kernel and per-step costs, 4-bit dequantization, attention at long contexts, the sampler.
So `probe --measure --model M` times the operations vLLM runs for that model, at its exact
shapes on one tensor-parallel rank, at a ladder of token counts:

- every dense linear layer of a decoder layer (QKV, O, gate+up, down; latent attention's
  projections), through vLLM's own GEMM dispatch where vLLM is installed (oneDNN / sgl-kernel on
  a CPU, cuBLAS on a GPU), ``torch.nn.functional.linear`` where it is not; FP8 weights through
  ``torch._scaled_mm`` on a GPU that has it;
- the two RMS norms and the gated activation (vLLM's ``rms_norm`` / ``silu_and_mul`` ops where
  present), the rotary embedding as the elementwise products it is;
- attention: prompt chunks (causal, tokens × tokens) and decode (one query per sequence against
  its context; a sliding window caps the context, a chunked layer reads its own chunk's keys
  as vLLM cuts it at the chunk boundaries; latent attention attends over one
  ``kv_lora_rank + rope`` head, as vLLM's MLA decode does), through PyTorch's SDPA;
- a mixture of experts' routed MLP (router, top-k, the experts the tokens route to);
- the LM head over the rows that sample, and the sampler (softmax, an exponential race).

Each operation is timed as the median of several rounds of back-to-back calls, weights cycled
through enough copies that a decode step streams them from memory rather than a cache. What is
not timed here (all-reduce: `probe --measure` times the link; the engine's own per-step host
cost: :func:`engine_step_s` below) is said in the table's ``missing``.

Pure parts (shapes, the table, its JSON and cache key) need nothing; torch is imported only by
the timing functions. A table is cached under ``$TOPOSERVE_CACHE/kernels/`` keyed by device,
driver, vLLM and torch versions and the shapes, so a second probe, or a plan, reads it back.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.probe import keptrecord
from launcher.probe.keptrecord import text_field, write_cache_json

# --------------------------------------------------------------------------------- the shapes


@dataclass(frozen=True)
class Linear:
    """One linear layer of a decoder layer, on one TP rank: ``[tokens × k] @ [k × n]``."""

    name: str
    k: int
    n: int
    weight_bits: int = 16  # 16 (bf16/fp16), 8 (FP8), 4 (AWQ/GPTQ)
    # the decoder layers that run it; 0: every one (a mixture of experts' shared experts run
    # in its MoE layers only, a dense MLP in its dense layers only)
    layers: int = 0


# The MLP linears a step shape may hold (launcher.planner.kernelcost.step_shape names them): a
# dense model's in every layer, a mixture of experts' shared experts' in its MoE layers and its
# dense layers' MLP; each a gate_up GEMM, SiLU-and-mul, then a down GEMM.
MLP_GATE_UPS = ("gate_up", "shared_gate_up", "dense_gate_up")
MLP_LINEARS = frozenset(MLP_GATE_UPS) | {"down", "shared_down", "dense_down"}


@dataclass(frozen=True)
class Attention:
    """The attention of ``layers`` decoder layers of one kind, on one TP rank."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    window: int | None = None
    latent: bool = False  # MLA: decode attends over one latent head of ``head_dim``
    # MLA (launcher.model.mla): a prompt chunk's decompressed q/k and v head dims, and the
    # latent's kv_lora_rank (the decode's value width); 0 where not latent or not known
    qk_dim: int = 0
    v_dim: int = 0
    rank: int = 0
    # ``window`` is a chunk of chunked local attention (Llama 4's RoPE layers), not a sliding
    # window: a query reads its own chunk's keys up to itself (launcher.model.modelspec
    # KvGroup.pairs), which vLLM's ChunkedLocalAttention runs as the plain causal kernel over
    # "virtual" sequences cut at the chunk boundaries (:meth:`pieces`)
    chunked: bool = False

    def decode_keys(self, context: int) -> int:
        """The keys a decoder at ``context`` tokens (its new one among them) reads: all of
        them; a sliding layer's last ``window``; a chunked layer's chunk up to its new token,
        (context - 1) mod window + 1 (vLLM's ``tokens_in_last_block``)."""
        if not self.window:
            return context
        if self.chunked:
            return (context - 1) % self.window + 1
        return min(context, self.window)

    def pieces(self, tokens: int, depth: int) -> tuple[tuple[int, int], ...]:
        """The (queries, keys) of the causal calls ``tokens`` new tokens after ``depth`` cached
        ones are run as: one over all ``depth + tokens`` keys, bar a chunked layer's, which
        vLLM cuts at its chunk boundaries (vllm/v1/attention/backends/utils.py
        ``make_local_attention_virtual_batches``: each piece the chunk's queries over the
        chunk's keys up to the last of them, through a block table of that chunk's pages)."""
        if not (self.chunked and self.window) or tokens <= 0:
            return ((tokens, depth + tokens),)
        c, out, pos, end = self.window, [], depth, depth + tokens
        while pos < end:
            start = pos // c * c
            stop = min(end, start + c)
            out.append((stop - pos, stop - start))
            pos = stop
        return tuple(out)


@dataclass(frozen=True)
class Moe:
    """A routed mixture of experts on one TP rank: ``experts`` of which ``top_k`` per token."""

    layers: int
    experts: int
    top_k: int
    intermediate: int  # per expert, on this rank


@dataclass(frozen=True)
class StepShape:
    """What one forward step of a model computes on one TP rank."""

    name: str
    layers: int
    hidden: int
    vocab: int  # the LM head's rows on this rank (vocab / tp)
    linears: tuple[Linear, ...]  # of one decoder layer (dense MLP included when not MoE)
    attention: tuple[Attention, ...]
    moe: Moe | None = None
    dtype: str = "bfloat16"

    def key(self) -> str:
        return _shape_key(self)


@functools.lru_cache(maxsize=1024)
def _shape_key(shape: StepShape) -> str:
    # The planner looks a kernel table up by this key for every candidate layout, the same few
    # shapes tens of thousands of times per plan; asdict + JSON + SHA-256 each time was 17% of
    # planning a model on 8xH100 (test_golden_plans: 8xh100 43 s).
    raw = asdict(shape)
    for lin in raw["linears"]:  # likewise: a linear of every layer is keyed as before
        if not lin.get("layers"):
            lin.pop("layers", None)
    for a in raw["attention"]:  # fields added later are keyed only where set, so that a table
        for f in (*_LATER_FIELDS, "chunked"):  # kept before them is still found for the same
            if not a.get(f):  # shape (a chunked one is not: it was timed as sliding)
                a.pop(f, None)
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]


_LATER_FIELDS = ("qk_dim", "v_dim", "rank")


# ---------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class KernelTime:
    """One operation at one size: ``seconds`` for one call (median of ``rounds``)."""

    op: str  # 'linear:qkv', 'norm', 'act', 'rope', 'attn:prefill', 'attn:decode', 'moe', 'head'
    tokens: int  # rows (tokens; sequences for decode attention and the head)
    seconds: float
    context: int = 0  # attention: keys per query
    group: int = 0  # attention: which Attention of the shape


@dataclass(frozen=True)
class TableKey:
    device: str  # "NVIDIA H200", "cpu: AMD EPYC 7B13 (2 threads)"
    driver: str  # CUDA driver / runtime, or the CPU's ISA flags that matter
    vllm: str  # vLLM's version, or "none"
    torch: str
    shape: str  # StepShape.key()

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class KernelTable:
    key: TableKey
    shape: StepShape
    times: tuple[KernelTime, ...]
    method: str  # which kernels: "vllm 0.32.0 ops on cpu", "torch 2.13 on cuda"
    measured_at: str  # ISO time
    engine_step_s: float | None = None  # the engine's own cost of a step besides its kernels
    missing: tuple[str, ...] = ()  # what this table does not hold, said in the plan
    notes: tuple[str, ...] = field(default=())
    # ops (KernelTime.op names without 'eager:') this table does not time with the engine's
    # own kernel: absent, or timed by a stand-in; the planner takes the roofline's figure
    untimed: tuple[str, ...] = ()

    def lookup(self, op: str, group: int = 0, context: int | None = None) -> list[KernelTime]:
        return sorted((t for t in self.times if t.op == op and t.group == group
                       and (context is None or t.context == context)), key=lambda t: t.tokens)


class KernelTableError(ValueError):
    """A saved kernel table that cannot be read (the caller measures again or plans without)."""


# ------------------------------------------------------------------------------------- JSON


def table_to_json(t: KernelTable) -> dict[str, Any]:
    return {"version": 1, **asdict(t)}


def _positive_int(raw: Any, what: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0 or raw > 1 << 40:
        raise KernelTableError(f"{what} is not a count: {str(raw)[:40]!r}")
    return raw


def _seconds(raw: Any, what: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise KernelTableError(f"{what} is not a number of seconds: {str(raw)[:40]!r}")
    value = float(raw)
    if not math.isfinite(value) or not 0 <= value < 3600:
        raise KernelTableError(f"{what} is not a number of seconds: {value!r}")
    return value


def _text(raw: Any, what: str) -> str:
    return text_field(raw, what, KernelTableError)


def _obj(raw: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise KernelTableError(f"{what} is not an object")
    return raw


def _list(raw: Any, what: str) -> list[Any]:
    if not isinstance(raw, list):
        raise KernelTableError(f"{what} is not a list")
    return raw


def _attention(a: Mapping[str, Any]) -> Attention:
    layers, heads, kv_heads, head_dim = (
        _positive_int(a.get(f), f) for f in ("layers", "heads", "kv_heads", "head_dim"))
    window = None if a.get("window") is None else _positive_int(a["window"], "window")
    qk, v, rank = (_positive_int(a.get(f, 0), f) for f in _LATER_FIELDS)
    return Attention(layers, heads, kv_heads, head_dim, window, a.get("latent") is True,
                     qk, v, rank, a.get("chunked") is True and window is not None)


def _shape(raw: Any) -> StepShape:
    s = _obj(raw, "shape")
    lin = tuple(Linear(_text(x.get("name"), "linear name"), _positive_int(x.get("k"), "k"),
                       _positive_int(x.get("n"), "n"),
                       _positive_int(x.get("weight_bits", 16), "weight bits"),
                       _positive_int(x.get("layers", 0), "linear layers"))
                for x in (_obj(y, "linear") for y in _list(s.get("linears"), "linears")))
    att = tuple(_attention(_obj(y, "attention")) for y in _list(s.get("attention"), "attention"))
    moe = None
    if s.get("moe") is not None:
        m = _obj(s["moe"], "moe")
        moe = Moe(*(_positive_int(m.get(f), f) for f in
                    ("layers", "experts", "top_k", "intermediate")))
    layers, hidden, vocab = (_positive_int(s.get(f), f) for f in ("layers", "hidden", "vocab"))
    return StepShape(_text(s.get("name"), "name"), layers, hidden, vocab, lin, att, moe,
                     _text(s.get("dtype", "bfloat16"), "dtype"))


def shape_from_json(raw: Any) -> StepShape:
    """A step shape as :func:`dataclasses.asdict` wrote it; :class:`KernelTableError` else."""
    return _shape(raw)


def table_from_json(raw: Any) -> KernelTable:
    """A saved table; :class:`KernelTableError` (one line) for anything unreadable."""
    d = _obj(raw, "kernel table")
    if d.get("version") != 1:
        raise KernelTableError(f"kernel table version {str(d.get('version'))[:20]!r} is not 1")
    k = _obj(d.get("key"), "key")
    key = TableKey(*(_text(k.get(f), f) for f in ("device", "driver", "vllm", "torch", "shape")))
    times = []
    for item in _list(d.get("times"), "times"):
        x = _obj(item, "time")
        times.append(KernelTime(_text(x.get("op"), "op"), _positive_int(x.get("tokens"), "tokens"),
                                _seconds(x.get("seconds"), "seconds"),
                                _positive_int(x.get("context", 0), "context"),
                                _positive_int(x.get("group", 0), "group")))
    # one timing a size: every reader interpolates an op's points by their token counts (and
    # attention's by context), which two timings of one size leave undefined; the probe never
    # writes them, so such a table was edited or joined, and is not read
    seen = Counter((t.op, t.group, t.tokens, t.context) for t in times)
    twice = next((k for k, n in seen.items() if n > 1), None)
    if twice is not None:
        raise KernelTableError(f"kernel table times {twice[0][:40]!r} at {twice[2]} tokens"
                               + (f" over {twice[3]} keys" if twice[3] else "") + " twice")
    step = d.get("engine_step_s")
    shape = _shape(d.get("shape"))
    if shape.key() != key.shape:
        raise KernelTableError("kernel table shape does not match its key")
    missing = tuple(_text(x, "missing") for x in _list(d.get("missing", []), "missing"))
    untimed = tuple(_text(x, "untimed") for x in _list(d.get("untimed", []), "untimed"))
    if any(x.startswith(_OLD_4BIT_AT_16) for x in missing):  # kept before 4-bit was timed:
        untimed += tuple(f"linear:{x.name}" for x in shape.linears  # its 16-bit stand-ins
                         if x.weight_bits == 4 and f"linear:{x.name}" not in untimed)
    return KernelTable(key, shape, tuple(times), _text(d.get("method"), "method"),
                       _text(d.get("measured_at"), "measured_at"),
                       None if step is None else _seconds(step, "engine_step_s"),
                       missing,
                       tuple(_text(x, "note") for x in _list(d.get("notes", []), "notes")),
                       untimed)


# How a table timed before its 4-bit GEMMs had their own kernel said that it timed them at 16
# bits: such timings are read back as stand-ins (``untimed``).
_OLD_4BIT_AT_16 = "4-bit GEMMs are timed at 16 bits"


def cache_path(cache_dir: Path, key: TableKey) -> Path:
    return cache_dir / "kernels" / f"{key.digest()}.json"


def save(cache_dir: Path, table: KernelTable) -> Path | None:
    """Write the table where a later plan finds it; None when nothing can be kept there."""
    return write_cache_json(cache_path(cache_dir, table.key), table_to_json(table))


KEPT = keptrecord.Kind(
    "the kernel table `probe --measure --model` kept", "planned as if none was kept",
    table_from_json, lambda table: table.key,
    again="`launcher probe --measure --model M` times the model again")


def read(cache_dir: Path, key: TableKey) -> tuple[KernelTable | None, str]:
    """The cached table for ``key``, or the one-line reason a kept file cannot be used
    (:func:`keptrecord.read`); (None, "") where none is."""
    return keptrecord.read(KEPT, cache_path(cache_dir, key), key)


def load(cache_dir: Path, key: TableKey) -> KernelTable | None:
    """The cached table for ``key``; None when there is none or it cannot be used."""
    return read(cache_dir, key)[0]


# ------------------------------------------------------------------------------------ timing

GPU_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
CPU_TOKENS = (1, 4, 16, 64, 256, 512, 2048)
PREFILL_CONTEXTS = (512, 2048)
# On a GPU also the chunks a long prompt is prefilled in: (new tokens, tokens cached before
# them) at the engine's 8,192-token budget, at depth 0, 8,192 and 24,576 (a 16k and a 32k
# prompt's chunks). FlashAttention's rate grows with the chunk: on the H200 (issue 22's third
# table) SDPA's 2,048-token point ran at ~230 TFLOP/s, while the Qwen2.5-14B shape's measured 16k
# first token (0.90 s, 0.68 s of it GEMMs by the same table) leaves its attention ~650; so a plan
# reads long prompts off these points instead of stretching the 2,048-token one.
GPU_PREFILL_CHUNKS = ((8192, 0), (8192, 8192), (8192, 24576))
# In a table's notes where its prompt-chunk attention was timed through vLLM's own
# FlashAttention (the FLASH_ATTN backend's kernel, which vLLM's MLA prefill runs too, at the
# decompressed head dims) rather than torch's SDPA.
FLASH_PREFILL_NOTE = "prompt-chunk attention timed through vLLM's FlashAttention"
DECODE_CONTEXTS = (1024, 8192)
DECODE_BATCH = 4
HEAD_ROWS = (1, 32)
ROUNDS = 5
# A decode GEMM's weights cycle through at least this many bytes, so that no cache holds them
# between calls (a GPU's L2 is at most ~130 MB; a server CPU's L3 a few hundred).
CYCLE_BYTES_GPU = 1 << 30
CYCLE_BYTES_CPU = 1 << 28


@dataclass(frozen=True)
class Budget:
    """How long each operation may be timed: at least ``min_s`` of calls per round, at most
    ``max_reps`` calls."""

    min_s: float = 0.02
    max_reps: int = 200
    rounds: int = ROUNDS


def _median_call_s(call: Callable[[], object], sync: Callable[[], None], budget: Budget) -> float:
    """Seconds of one call: the median over rounds of back-to-back calls (the median, not the
    minimum, so that a busy machine's steady slowdown is kept: the engine runs on it too)."""
    call()
    sync()
    t0 = time.perf_counter()
    call()
    sync()
    once = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, min(budget.max_reps, int(budget.min_s / once)))
    rounds = []
    for _ in range(budget.rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        sync()
        rounds.append((time.perf_counter() - t0) / reps)
    return statistics.median(rounds)


def _graph_call_s(torch: Any, call: Callable[[], object], budget: Budget) -> float | None:
    """Device seconds of one call, replayed from a CUDA graph of back-to-back calls: what the
    op costs inside vLLM's captured decode steps, with no host launch cost. None when the op
    cannot be captured (a host sync inside it)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            for _ in range(3):
                call()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        reps = max(1, min(budget.max_reps, 20))
        with torch.cuda.graph(graph):
            for _ in range(reps):
                call()
        graph.replay()
        torch.cuda.synchronize()
    except RuntimeError:
        torch.cuda.synchronize()
        return None
    rounds = []
    for _ in range(budget.rounds):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        rounds.append(float(start.elapsed_time(end)) / 1e3 / reps)
    del graph
    return statistics.median(rounds)


class _Ops:
    """The operations, bound to one torch device and the kernels available on it."""

    def __init__(self, torch: Any, device: str, dtype: str) -> None:
        self.torch, self.device = torch, device
        self.dtype = getattr(torch, dtype)
        self.vllm_ops: Any = None
        self.vllm_dispatch: Any = None
        # op -> why: timed by something other than the engine's kernel, or not timed at all;
        # the table says so (KernelTable.untimed) and the planner takes the roofline's figure
        self.untimed: dict[str, str] = {}
        self._mixed: dict[Linear, tuple[list[Callable[[Any], object]], str] | None] = {}
        # the vLLM kernels latent attention's decode was timed through (the table's notes)
        self.latent_decode_kernels: set[str] = set()
        # the fused-MoE op's router as vLLM runs it, where it did (the table's notes)
        self.moe_router: set[str] = set()
        try:  # vLLM's own ops (its C++/CUDA extension): the kernels it really runs
            from vllm import _custom_ops

            self.vllm_ops = _custom_ops
            if device == "cpu":
                from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

                self.vllm_dispatch = dispatch_cpu_unquantized_gemm
        except Exception:  # any failure to import vLLM means plain torch
            self.vllm_ops = None

    def sync(self) -> None:
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def randn(self, *shape: int) -> Any:
        return self.torch.randn(*shape, device=self.device, dtype=self.dtype)

    def linear(self, lin: Linear, tokens: int, cycle_bytes: int) -> Callable[[], object] | None:
        """One call of ``lin`` on ``tokens`` rows; None where its weights' kernel cannot be run
        here (4-bit without vLLM's mixed-input kernels: said in ``untimed``, never timed at 16
        bits)."""
        torch = self.torch
        copies = max(1, min(64, cycle_bytes // max(1, lin.k * lin.n * 2))) if tokens <= 64 else 1
        x = self.randn(tokens, lin.k)
        if lin.weight_bits == 4:
            mixed = self.mixed_input(lin, cycle_bytes)
            if mixed is None:
                return None
            qfns, _ = mixed
            qstate = [0]

            def mixed_call() -> object:
                qstate[0] = (qstate[0] + 1) % len(qfns)
                return qfns[qstate[0]](x)

            return mixed_call
        if lin.weight_bits == 8 and self.device != "cpu" and hasattr(torch, "_scaled_mm"):
            fp8 = torch.float8_e4m3fn
            ws = [self.randn(lin.n, lin.k).to(fp8).t() for _ in range(copies)]
            xq, one = x.to(fp8), torch.ones((), device=self.device)
            state = [0]

            def fp8_call() -> object:
                state[0] = (state[0] + 1) % copies
                return torch._scaled_mm(xq, ws[state[0]], scale_a=one, scale_b=one,
                                        out_dtype=self.dtype)

            return fp8_call
        fns = [self._dense(lin) for _ in range(copies)]
        state = [0]

        def call() -> object:
            state[0] = (state[0] + 1) % copies
            return fns[state[0]](x)

        return call

    def mixed_input(
        self, lin: Linear, cycle_bytes: int
    ) -> tuple[list[Callable[[Any], object]], str] | None:
        """A 4-bit linear through the mixed-input GEMM vLLM picks for this device
        (``choose_mp_linear_kernel``: Machete on compute capability 9.0, Marlin on other CUDA
        cards, its CPU kernel on a CPU), with random packed weights in the checkpoint's layout
        (AWQ's: uint4 with zero points, groups of 128) made ready by the kernel's own
        ``process_weights_after_loading`` (Machete's prepack, Marlin's repack); copies enough to
        stream from memory. None, with the reason in ``untimed``, where any of it fails."""
        if lin in self._mixed:
            return self._mixed[lin]
        op = f"linear:{lin.name}"
        try:
            fns, name = self._mixed_kernels(lin, cycle_bytes)
        except Exception as exc:  # any failure: not timed, the roofline's figure instead
            self.untimed[op] = (f"4-bit GEMM {op} not timed (vLLM's mixed-input kernel: "
                                f"{type(exc).__name__}: {str(exc)[:80]})")
            self._mixed[lin] = None
            return None
        self._mixed[lin] = (fns, name)
        return fns, name

    def _mixed_kernels(
        self, lin: Linear, cycle_bytes: int
    ) -> tuple[list[Callable[[Any], object]], str]:
        torch = self.torch
        try:
            from vllm.model_executor.kernels.linear import (  # vLLM 0.32
                MPLinearLayerConfig,
                choose_mp_linear_kernel,
            )
        except ImportError:  # vLLM 0.26
            from vllm.model_executor.layers.quantization.kernels.mixed_precision import (
                MPLinearLayerConfig,
                choose_mp_linear_kernel,
            )
        from vllm.model_executor.parameter import GroupQuantScaleParameter, PackedvLLMParameter
        from vllm.scalar_type import scalar_types

        group = 128 if lin.k % 128 == 0 else -1
        rows = lin.k // (group if group > 0 else lin.k)
        extra = {f.name: False for f in dataclasses.fields(MPLinearLayerConfig)
                 if f.name == "has_g_idx"}  # a field of older releases: no act-order here
        cfg = MPLinearLayerConfig(full_weight_shape=(lin.k, lin.n),
                                  partition_weight_shape=(lin.k, lin.n),
                                  weight_type=scalar_types.uint4, act_type=self.dtype,
                                  group_size=group, zero_points=True, **extra)
        kind = choose_mp_linear_kernel(cfg)
        copies = max(1, min(64, cycle_bytes // max(1, lin.k * lin.n // 2)))

        def no_load(*_: Any, **__: Any) -> None:
            return None

        def ints(*shape: int) -> Any:
            return torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32,
                                 device=self.device)

        fns: list[Callable[[Any], object]] = []
        # vLLM's parameters read their TP rank when made; the probe runs outside an engine, so
        # no TP group exists: one rank of one, which is what the shape is (already per rank)
        from unittest import mock

        import vllm.model_executor.parameter as vparam

        with (mock.patch.object(vparam, "get_tensor_model_parallel_rank", return_value=0),
              mock.patch.object(vparam, "get_tensor_model_parallel_world_size",
                                return_value=1)):
            for _ in range(copies):
                fns.append(self._mixed_layer(lin, cfg, kind, rows, ints, no_load,
                                             GroupQuantScaleParameter, PackedvLLMParameter))
        fns[0](self.randn(1, lin.k))  # runs at all, here
        return fns, kind.__name__

    def _mixed_layer(self, lin: Linear, cfg: Any, kind: Any, rows: int,
                     ints: Callable[..., Any], no_load: Callable[..., None], scale_param: Any,
                     packed_param: Any) -> Callable[[Any], object]:
        """One layer of random 4-bit weights, made ready by the kernel itself."""
        torch = self.torch
        layer = torch.nn.Module()
        layer.qweight = packed_param(data=ints(lin.k // 8, lin.n), input_dim=0,
                                     output_dim=1, packed_dim=0, packed_factor=8,
                                     weight_loader=no_load)
        layer.scales = scale_param(data=self.randn(rows, lin.n) * 0.01, input_dim=0,
                                   output_dim=1, weight_loader=no_load)
        layer.qzeros = packed_param(data=ints(rows, lin.n // 8), input_dim=0, output_dim=1,
                                    packed_dim=1, packed_factor=8, weight_loader=no_load)
        kernel = kind(cfg, w_q_param_name="qweight", w_s_param_name="scales",
                      w_zp_param_name="qzeros")
        kernel.process_weights_after_loading(layer)
        return functools.partial(kernel.apply_weights, layer)

    def _dense(self, lin: Linear) -> Callable[[Any], object]:
        torch = self.torch
        w = self.randn(lin.n, lin.k)
        if self.vllm_dispatch is not None:
            layer = torch.nn.Module()
            layer.weight = torch.nn.Parameter(w, requires_grad=False)
            self.vllm_dispatch(layer, False)
            fn = layer.cpu_linear
            return lambda x: fn(x, layer.weight, None)
        return lambda x: torch.nn.functional.linear(x, w)

    def norm(self, tokens: int, hidden: int) -> Callable[[], object]:
        torch = self.torch
        x, w = self.randn(tokens, hidden), self.randn(hidden)
        if self.vllm_ops is not None and hasattr(self.vllm_ops, "rms_norm"):
            out = torch.empty_like(x)
            return lambda: self.vllm_ops.rms_norm(out, x, w, 1e-6)

        return lambda: torch.nn.functional.rms_norm(x, (hidden,), w, 1e-6)

    def act(self, tokens: int, inter: int) -> Callable[[], object]:
        torch = self.torch
        x = self.randn(tokens, 2 * inter)
        if self.vllm_ops is not None and hasattr(torch.ops._C, "silu_and_mul"):
            out = self.randn(tokens, inter)
            return lambda: torch.ops._C.silu_and_mul(out, x)
        return lambda: torch.nn.functional.silu(x[:, :inter]) * x[:, inter:]

    def rope(self, tokens: int, width: int) -> Callable[[], object]:
        x, cos, sin = (self.randn(tokens, width) for _ in range(3))
        half = width // 2

        def call() -> object:
            rotated = self.torch.cat((-x[:, half:], x[:, :half]), dim=-1)
            return x * cos + rotated * sin

        return call

    def attention(
        self, a: Attention, queries: int, context: int, seqs: int
    ) -> Callable[[], object] | None:
        """``seqs`` sequences of ``queries`` new tokens each attending over ``context`` keys
        (causal when queries == context). Latent attention in the forms vLLM runs
        (:meth:`latent_prefill`, SDPA where vLLM's FlashAttention is not timed; and
        :meth:`latent_decode`); None where it cannot be (said in ``untimed``)."""
        torch = self.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if a.latent:
            if queries > 1:
                return self.latent_prefill(a, queries, seqs)
            return self.latent_decode(a, context, seqs)
        kv_heads, head_dim = a.kv_heads, a.head_dim
        gqa = a.heads != kv_heads
        if a.chunked and a.window:
            # as vLLM runs it: the decoder's chunk up to itself, a prompt's queries cut at the
            # chunk boundaries into causal pieces, the pieces of one size batched together
            cut = ((1, a.decode_keys(context)),) if queries == 1 else \
                a.pieces(queries, context - queries)
            calls = []
            for (n, keys), count in Counter(cut).items():
                q = self.randn(seqs * count, a.heads, n, head_dim)
                k = self.randn(seqs * count, kv_heads, keys, head_dim)
                v = self.randn(seqs * count, kv_heads, keys, head_dim)
                calls.append((q, k, v, n == keys and n > 1))
            return lambda: [sdpa(q, k, v, is_causal=c, enable_gqa=gqa) for q, k, v, c in calls]
        keys = min(context, a.window) if a.window else context
        q = self.randn(seqs, a.heads, queries, head_dim)
        k = self.randn(seqs, kv_heads, keys, head_dim)
        v = self.randn(seqs, kv_heads, keys, head_dim)
        causal = queries == keys and queries > 1
        return lambda: sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)

    def flash_prefill(self, a: Attention, tokens: int, depth: int) -> Callable[[], object] | None:
        """A prompt chunk of ``tokens`` after ``depth`` cached ones through vLLM's own
        FlashAttention, as vLLM runs that chunk; None on a CPU, and where that kernel is not
        here or refuses the shape (then SDPA times the whole prompts only: :meth:`attention`).

        Ordinary attention: the FLASH_ATTN backend's call, query and KV heads as the model has
        them, the sliding window as vLLM passes it. Latent attention (MLA): vLLM's prefill
        decompresses the latents through kv_b_proj (``linear:kv_b``) and runs the same varlen
        kernel as multi-head attention, every query head its own K/V, q/k head dim ``qk_dim``
        (nope + rope) and v head dim ``v_dim`` (its MLA FlashAttention prefill backend), never
        at the latent's 576. Without those dims (a shape from before them) None: the SDPA
        stand-in (:meth:`latent_prefill`) says it is untimed."""
        if self.device == "cpu":
            return None
        if not a.latent:
            if a.chunked:  # the chunk's pieces, each causal over its own chunk, no window
                return self._flash_varlen(a.pieces(tokens, depth), a.heads, a.kv_heads,
                                          a.head_dim, a.head_dim, None)
            return self._flash_varlen(((tokens, depth + tokens),), a.heads, a.kv_heads,
                                      a.head_dim, a.head_dim, a.window)
        if not (a.qk_dim and a.v_dim):
            return None
        return self._flash_varlen(((tokens, depth + tokens),), a.heads, a.heads, a.qk_dim,
                                  a.v_dim, None)

    def _flash_varlen(self, pieces: Sequence[tuple[int, int]], heads: int, kv_heads: int,
                      qk_dim: int, v_dim: int, window: int | None
                      ) -> Callable[[], object] | None:
        """A chunk through ``vllm_flash_attn.flash_attn_varlen_func`` at the version vLLM picks
        first (FA3 on Hopper, else FA2), ``pieces`` its (queries, keys) sequences of one call:
        one sequence's chunk causal from its last row over the ``depth + tokens`` keys, as the
        FLASH_ATTN backend runs a chunk (a chunked layer's the chunk's pieces within each
        attention chunk, :meth:`Attention.pieces`, as vLLM's virtual batches). vLLM's MLA
        prefill covers the same (query, key) pairs in a causal call over the new tokens and
        unmasked calls over the cached context's chunks, merged by their LSEs: that split, the
        merge and the context's decompression are not timed here. Where v's head dim differs
        from q/k's: unpadded first where vLLM passes it so (FA3, which takes differing dims on
        Hopper), else as vLLM pads it (``_flash_attn_varlen_diff_headdims``), v zero-padded to
        ``qk_dim`` on every call and the output sliced back. Contiguous K/V, not the paged
        cache: the same kernel's work. None where the kernel is absent or refuses every form."""
        torch = self.torch
        try:
            from vllm.vllm_flash_attn import flash_attn_varlen_func
            from vllm.vllm_flash_attn.flash_attn_interface import is_fa_version_supported

            version = next(v for v in (3, 2) if is_fa_version_supported(v))
            tokens = sum(n for n, _ in pieces)
            keys = sum(k for _, k in pieces)
            q = self.randn(tokens, heads, qk_dim)
            k = self.randn(keys, kv_heads, qk_dim)
            v = self.randn(keys, kv_heads, v_dim)
            cu_q = torch.tensor([0, *itertools.accumulate(n for n, _ in pieces)],
                                dtype=torch.int32, device=self.device)
            cu_k = torch.tensor([0, *itertools.accumulate(k for _, k in pieces)],
                                dtype=torch.int32, device=self.device)
            most_q, most_k = max(n for n, _ in pieces), max(k for _, k in pieces)
            span = [window - 1, 0] if window else [-1, -1]
        except Exception:  # not installed, no version for this card
            return None

        def run(values: Any) -> Any:
            return flash_attn_varlen_func(q, k, values, most_q, cu_q, most_k, cu_seqlens_k=cu_k,
                                          softmax_scale=qk_dim ** -0.5, causal=True,
                                          window_size=span, fa_version=version)

        def padded() -> object:
            return run(torch.nn.functional.pad(v, [0, qk_dim - v_dim]))[..., :v_dim]

        forms: list[Callable[[], object]] = []
        if v_dim == qk_dim or version == 3:
            forms.append(lambda: run(v))
        if v_dim < qk_dim:
            forms.append(padded)
        for call in forms:
            try:
                call()
                self.sync()
                return call
            except Exception:  # a shape this kernel refuses: the next form, else None
                continue
        return None

    def latent_prefill(self, a: Attention, tokens: int, seqs: int) -> Callable[[], object] | None:
        """A prompt chunk of latent attention where vLLM's FlashAttention is not timed (a
        CPU, no vLLM FlashAttention, a shape it refuses: :meth:`flash_prefill`): MHA at the
        decompressed dims as vLLM runs it, q/k head dim ``qk_dim`` and v head dim ``v_dim``,
        v padded with zeros to ``qk_dim`` as vLLM pads it for kernels that need equal dims.
        Here SDPA (its flash kernel on a GPU: a head dim of 192 is within it), never at the
        latent's 576, where SDPA has only its math kernel; so whole prompts only, at depth 0.
        None without the dims (an older shape)."""
        if not (a.qk_dim and a.v_dim):
            self.untimed["attn:prefill"] = ("latent attention's prefill not timed: the shape "
                                            "lacks its decompressed head dims")
            return None
        sdpa = self.torch.nn.functional.scaled_dot_product_attention
        q, k = (self.randn(seqs, a.heads, tokens, a.qk_dim) for _ in range(2))
        v = self.torch.zeros(seqs, a.heads, tokens, a.qk_dim, device=self.device,
                             dtype=self.dtype)
        v[..., : a.v_dim] = self.randn(seqs, a.heads, tokens, a.v_dim)
        return lambda: sdpa(q, k, v, is_causal=True)[..., : a.v_dim]

    def latent_decode(self, a: Attention, context: int, seqs: int) -> Callable[[], object] | None:
        """A decode step of latent attention, the absorbed form vLLM runs: ``heads`` query heads
        of the latent's width (kv_lora_rank + rope) against the one cached latent head, values
        the first ``rank`` columns of the same cache (multi-query attention over the latent;
        the W_UK / W_UV bmms around it read kv_b_proj's weights: ``linear:kv_b``). On a GPU,
        vLLM's own MLA decode kernel over a paged cache, the first of the two it prefers that
        runs here: FlashAttention's MLA decode (FLASH_ATTN_MLA, FA3: Hopper; what vLLM 0.26
        chose on the lent H200) and its Triton kernel (TRITON_MLA, any card). The tenth H200
        table's GLM shape showed why the choice matters: the Triton kernel took a flat ~150 us a
        layer for 4 sequences at 1,024 and 8,192 tokens, and per-token decode attention read
        off it put a 32-stream step at 20.4 ms where the engine, on FLASH_ATTN_MLA, took 16.6.
        Elsewhere (or where neither runs) a stand-in, two batched matmuls over the cache
        (memory bound like the kernel), said in ``untimed``. None without the latent's rank."""
        if not a.rank:
            self.untimed["attn:decode"] = ("latent attention's decode not timed: the shape "
                                           "lacks the latent's rank")
            return None
        if self.device != "cpu":
            for name, kernel in (("FlashAttention MLA (FA3)", self._flash_mla_decode),
                                 ("Triton MLA", self._triton_mla_decode)):
                timed = kernel(a, context, seqs)
                if timed is not None:
                    self.latent_decode_kernels.add(name)
                    return timed
        torch = self.torch
        cache = self.randn(seqs, context, a.head_dim)
        q = self.randn(seqs, a.heads, a.head_dim)
        scale = 1.0 / math.sqrt(a.qk_dim or a.head_dim)
        self.untimed.setdefault("attn:decode", (
            "latent attention's decode timed by a stand-in (two batched matmuls over the "
            "latent cache), not vLLM's MLA decode kernel"))

        def call() -> object:
            p = torch.softmax(torch.bmm(q, cache.transpose(1, 2)) * scale, dim=-1)
            return torch.bmm(p, cache[:, :, : a.rank])

        return call

    def _paged_latent(self, a: Attention, context: int, seqs: int) -> tuple[Any, Any, Any]:
        """The latent cache as vLLM's MLA decode kernels read it: ``seqs`` sequences of
        ``context`` tokens in 16-token blocks of one latent head, ``[blocks, 16, 1, head_dim]``
        (the first ``rank`` columns the latent, the rest its rope keys), with each sequence's
        block table and length."""
        torch, page = self.torch, 16
        blocks = -(-context // page)
        cache = self.randn(seqs * blocks, page, a.head_dim).unsqueeze(2)
        table = torch.arange(seqs * blocks, device=self.device,
                             dtype=torch.int32).view(seqs, blocks)
        lens = torch.full((seqs,), context, device=self.device, dtype=torch.int32)
        return cache, table, lens

    def _flash_mla_decode(
        self, a: Attention, context: int, seqs: int
    ) -> Callable[[], object] | None:
        """vLLM's FlashAttention MLA decode (FlashAttnMLAImpl.forward_mqa's call: FA3's
        varlen kernel with the rope part of each query head against the cache's rope columns,
        ``q_v`` the latent part against the latent columns, which are also the values; one
        query a sequence, a paged cache of 16-token blocks), or None where FA3 is not here."""
        torch = self.torch
        try:
            from vllm.vllm_flash_attn import flash_attn_varlen_func
            from vllm.vllm_flash_attn.flash_attn_interface import is_fa_version_supported

            if not is_fa_version_supported(3):  # vLLM's FLASH_ATTN_MLA is FA3 only
                return None
            cache, table, lens = self._paged_latent(a, context, seqs)
            kv_c, k_pe = cache[..., : a.rank], cache[..., a.rank:]  # one KV head: the latent
            rope = a.head_dim - a.rank
            q_nope, q_pe = self.randn(seqs, a.heads, a.rank), self.randn(seqs, a.heads, rope)
            cu_q = torch.arange(seqs + 1, device=self.device, dtype=torch.int32)
            scale = 1.0 / math.sqrt(a.qk_dim or a.head_dim)

            def call() -> object:
                return flash_attn_varlen_func(q=q_pe, k=k_pe, v=kv_c, q_v=q_nope, max_seqlen_q=1,
                                              cu_seqlens_q=cu_q, max_seqlen_k=context,
                                              seqused_k=lens, block_table=table,
                                              softmax_scale=scale, causal=True, fa_version=3)

            call()
            self.sync()
        except Exception:  # not installed, no FA3 here, a build without q_v: the next kernel
            return None
        return call

    def _triton_mla_decode(
        self, a: Attention, context: int, seqs: int
    ) -> Callable[[], object] | None:
        """vLLM's Triton MLA decode (TritonMLAImpl.forward_mqa's call), or None."""
        torch = self.torch
        try:
            try:
                from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd
            except ImportError:
                from vllm.attention.ops.triton_decode_attention import decode_attention_fwd
            cache, table, lens = self._paged_latent(a, context, seqs)
            page = cache.shape[1]
            q = self.randn(seqs, a.heads, a.head_dim)
            o = torch.zeros(seqs, a.heads, a.rank, device=self.device, dtype=self.dtype)
            lse = torch.zeros(seqs, a.heads, device=self.device, dtype=self.dtype)
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            # vLLM's _compute_num_kv_splits: a power of two, ~512 keys a split, <= 2 per SM
            splits = min(1 << max(0, (max(1, context // 512) - 1).bit_length()), 2 * sms)
            logits = torch.empty(seqs, a.heads, splits, a.rank + 1, device=self.device,
                                 dtype=torch.float32)
            scale = 1.0 / math.sqrt(a.qk_dim or a.head_dim)
            v = cache[..., : a.rank]
            calls: list[Callable[[], object]] = [
                lambda: decode_attention_fwd(q, cache, v, o, lse, table, lens, logits, splits,
                                             scale, page, is_mla=True),
                lambda: decode_attention_fwd(q, cache, v, o, lse, table, lens, logits, splits,
                                             scale, page),
                lambda: decode_attention_fwd(q, cache, v, o, table, lens, logits, splits, scale,
                                             page),
            ]
            for call in calls:
                try:
                    call()
                    torch.cuda.synchronize()
                    return call
                except (TypeError, RuntimeError, ValueError, AssertionError):
                    continue
        except Exception:  # not importable here: the stand-in
            return None
        return None

    def moe(self, m: Moe, tokens: int, hidden: int) -> Callable[[], object]:
        torch = self.torch
        x = self.randn(tokens, hidden)
        router = self.randn(hidden, m.experts)
        w13 = self.randn(m.experts, 2 * m.intermediate, hidden)
        w2 = self.randn(m.experts, hidden, m.intermediate)
        fused, topk = self._vllm_moe()
        route = self._vllm_route(topk, x, x @ router, m.top_k) if fused is not None else None
        grouped = None if fused is not None else self._grouped_moe(m, x, w13, w2)

        def call() -> object:
            logits = x @ router
            if fused is not None and route is not None:  # as vLLM runs it
                weights, ids = route(logits)
                return fused(x, w13, w2, weights, ids)
            scores = torch.softmax(logits.float(), dim=-1)
            weights, ids = torch.topk(scores, m.top_k, dim=-1)
            if fused is not None:
                return fused(x, w13, w2, weights.to(x.dtype), ids.to(torch.int32))
            if grouped is not None:
                return grouped(weights, ids)
            out = torch.zeros_like(x)
            flat = ids.flatten()
            for e in torch.unique(flat).tolist():
                rows = (ids == e).any(-1).nonzero().flatten()
                h = x[rows] @ w13[e].t()
                g = torch.nn.functional.silu(h[:, : m.intermediate]) * h[:, m.intermediate :]
                out.index_add_(0, rows, g @ w2[e].t())
            return out

        return call

    def _vllm_moe(self) -> tuple[Any, Any]:
        """vLLM's ``fused_experts`` and ``fused_topk`` on a GPU; None each where not here."""
        if self.device == "cpu":
            return None, None
        try:
            import vllm.model_executor.layers.fused_moe as fused_moe
        except Exception:  # plain torch instead
            return None, None
        return getattr(fused_moe, "fused_experts", None), getattr(fused_moe, "fused_topk", None)

    def _vllm_route(
        self, topk: Any, x: Any, logits: Any, k: int
    ) -> Callable[[Any], tuple[Any, Any]] | None:
        """The router after its GEMM as vLLM's FusedMoE runs it: ``fused_topk``, one fused
        top-k softmax kernel that writes fp32 weights and int32 ids as ``fused_experts`` takes
        them (ops.topk_softmax), where torch's softmax, top-k and casts are five kernels (issue
        22: tables timed that way charged a MoE layer ~4 kernels vLLM does not run). None where
        it is not here or fails on this shape; the table's notes say which timed the op."""
        if topk is None:
            return None

        def route(scores: Any) -> tuple[Any, Any]:
            out = topk(x, scores, k, True)  # (weights, ids[, token_expert_indices])
            return out[0], out[1]

        try:
            route(logits)
            self.sync()
        except Exception:  # a release whose fused_topk differs: torch's router instead
            return None
        self.moe_router.add("MoE router timed through vLLM's fused top-k softmax")
        return route

    def _grouped_moe(
        self, m: Moe, x: Any, w13: Any, w2: Any
    ) -> Callable[[Any, Any], object] | None:
        """Without vLLM on a GPU: the routed tokens sorted by expert through torch's grouped
        GEMM (the same one-launch-per-projection shape as vLLM's fused MoE, no host sync, so
        it can be captured); None where this torch or GPU lacks it."""
        torch = self.torch
        if self.device == "cpu" or not hasattr(torch, "_grouped_mm"):
            return None
        w13t, w2t = w13.transpose(-2, -1), w2.transpose(-2, -1)
        ones = torch.ones(x.shape[0] * m.top_k, device=self.device, dtype=torch.int32)

        def call(weights: Any, ids: Any) -> object:
            flat = ids.flatten()
            order = torch.argsort(flat)
            rows = order // m.top_k
            counts = torch.zeros(m.experts, device=self.device, dtype=torch.int32)
            offs = torch.cumsum(counts.index_add_(0, flat, ones), 0).to(torch.int32)
            h = torch._grouped_mm(x[rows], w13t, offs=offs)
            g = torch.nn.functional.silu(h[:, : m.intermediate]) * h[:, m.intermediate :]
            y = torch._grouped_mm(g, w2t, offs=offs) * weights.flatten()[order, None].to(x.dtype)
            return torch.zeros_like(x).index_add_(0, rows, y)

        try:
            call(*torch.topk(torch.rand(x.shape[0], m.experts, device=self.device), m.top_k))
        except (RuntimeError, TypeError):
            return None
        return call

    def head(self, rows: int, hidden: int, vocab: int) -> Callable[[], object]:
        """The LM head over the sampling rows, then vLLM's sampler: temperature, softmax and
        an exponential race (its random sampling)."""
        torch = self.torch
        x, w = self.randn(rows, hidden), self.randn(vocab, hidden)

        def call() -> object:
            logits = torch.nn.functional.linear(x, w).float() / 0.7
            probs = torch.softmax(logits, dim=-1)
            return (probs / torch.empty_like(probs).exponential_()).argmax(dim=-1)

        return call


def time_table(
    shape: StepShape,
    key: TableKey,
    *,
    torch: Any,
    device: str,
    tokens: Sequence[int] | None = None,
    budget: Budget = Budget(),
    now: str | None = None,
) -> KernelTable:
    """Time every operation of ``shape`` on ``device`` ("cpu" or "cuda")."""
    ops = _Ops(torch, device, shape.dtype)
    ladder = tuple(tokens or (CPU_TOKENS if device == "cpu" else GPU_TOKENS))
    cycle = CYCLE_BYTES_CPU if device == "cpu" else CYCLE_BYTES_GPU
    times: list[KernelTime] = []

    def timed(
        op: str, n: int, call: Callable[[], object] | None, context: int = 0, group: int = 0
    ) -> None:
        if call is None:  # not runnable here: in ``untimed``, the roofline's figure
            return
        # Eager: launched from Python, as vLLM runs a step larger than its captured graphs
        # (and every step on a CPU). On a GPU also from a CUDA graph, as it runs the rest.
        eager = _median_call_s(call, ops.sync, budget)
        if device == "cpu":
            times.append(KernelTime(op, n, eager, context, group))
            return
        graphed = _graph_call_s(torch, call, budget)
        times.append(KernelTime(op, n, eager if graphed is None else graphed, context, group))
        times.append(KernelTime(f"eager:{op}", n, eager, context, group))

    # the SiLU-and-mul of the model's dense MLP: every layer's, else the shared experts' (a
    # mixture of experts' routed activation is inside its fused op)
    inter = next((lin.n // 2 for name in MLP_GATE_UPS for lin in shape.linears
                  if lin.name == name), 0)
    width = sum(a.heads * a.head_dim for a in shape.attention[:1]) or shape.hidden
    latent = next((a for a in shape.attention if a.latent and a.qk_dim and a.rank), None)
    if latent is not None:  # MLA rotates only its rope dims: each query head's and the latent's
        width = (latent.heads + 1) * (latent.head_dim - latent.rank)
    with torch.inference_mode():
        for n in ladder:
            for lin in shape.linears:
                timed(f"linear:{lin.name}", n, ops.linear(lin, n, cycle))
            timed("norm", n, ops.norm(n, shape.hidden))
            timed("rope", n, ops.rope(n, width))
            if inter:
                timed("act", n, ops.act(n, inter))
            if shape.moe is not None:
                timed("moe", n, ops.moe(shape.moe, n, shape.hidden))
        flash = False
        for g, a in enumerate(shape.attention):
            for ctx in PREFILL_CONTEXTS:
                fa = ops.flash_prefill(a, ctx, 0)
                flash = flash or fa is not None
                timed("attn:prefill", ctx, fa or ops.attention(a, ctx, ctx, 1), ctx, g)
            for n, depth in GPU_PREFILL_CHUNKS if device != "cpu" else ():
                fa = ops.flash_prefill(a, n, depth)
                if fa is not None:  # SDPA cannot mask a chunk after a cached prefix
                    timed("attn:prefill", n, fa, depth + n, g)
                elif depth == 0:
                    timed("attn:prefill", n, ops.attention(a, n, n, 1), n, g)
            for ctx in DECODE_CONTEXTS:
                timed("attn:decode", DECODE_BATCH, ops.attention(a, 1, ctx, DECODE_BATCH), ctx, g)
        for rows in HEAD_ROWS:
            timed("head", rows, ops.head(rows, shape.hidden, shape.vocab))
    method = (f"vLLM {key.vllm} ops where it has them, torch {key.torch} SDPA and elementwise, "
              f"on {device}") if ops.vllm_ops is not None else f"torch {key.torch} on {device}"
    missing = ["all-reduce and send/recv (timed per link by probe --measure)"]
    missing += sorted(set(ops.untimed.values()))
    mixed = tuple(f"4-bit GEMMs timed through vLLM's {name}" for name in
                  sorted({v[1] for v in ops._mixed.values() if v is not None}))
    if any(lin.weight_bits == 8 for lin in shape.linears) and device == "cpu":
        missing.append("FP8 GEMMs are timed at 16 bits on a CPU")
    decode = tuple(f"latent attention's decode timed through vLLM's {name}"
                   for name in sorted(ops.latent_decode_kernels))
    return KernelTable(key, shape, tuple(times), method,
                       now or time.strftime("%Y-%m-%dT%H:%M:%S"), None, tuple(missing),
                       ((FLASH_PREFILL_NOTE,) if flash else ()) + mixed + decode
                       + tuple(sorted(ops.moe_router)),
                       tuple(sorted(ops.untimed)))


def cpu_device_name(cpuinfo: str, threads: int) -> str:
    """``cpu: MODEL (N threads)`` from /proc/cpuinfo's text."""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                  if line.lower().startswith("model name")), "unknown CPU")
    return f"cpu: {model} ({threads} threads)"


def cpu_isa(cpuinfo: str) -> str:
    """The vector extensions that pick vLLM's CPU kernels (AVX-512 BF16, AMX)."""
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.lower().startswith("flags")), [])
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return " ".join(f for f in wanted if f in flags) or "no AVX2"
