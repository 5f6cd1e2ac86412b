"""What one GPU achieves at an LLM's matmul shapes, as `probe --measure` timed it. Pure.

Two figures, each the rate the cost model would otherwise take from the datasheet table times an
assumed efficiency (launcher/planner/hardware.py):

- ``prefill_tflops``: achieved BF16 TFLOP/s of the GEMMs a 512-token prefill of a 7-70B model
  runs (``[512 x h] x [h x h]``, ``[512 x h] x [h x 4h]``, ``[512 x 4h] x [4h x h]`` for hidden
  sizes 4096, 5120 and 8192): total FLOPs over total time, so the big shapes weigh as they do in
  a real prefill;
- ``decode_gbs``: achieved GB/s of decode-step GEMMs (``[b x h] x [h x 4h]``, b = 1, 8, 32) that
  read weights far larger than any L2 cache: bytes moved (weights + activations) over time. At
  these batch sizes a step is bound by reading the weights, which is what decode costs;
- ``kernel_s``: the fixed cost of one kernel replayed in a CUDA graph, besides its bytes at the
  card's rate (the gap between two kernels, the ramp-up and tail of each): one-row GEMVs of
  several weight sizes (:data:`GRAPH_GEMV_NS`), each size captured back to back in one graph and
  replayed, per call; the straight line through time against bytes (:func:`graph_kernel_fit`)
  crosses zero bytes at it. A full-graph decode step pays it for every kernel of every layer
  (costmodel.decode_step_s, the layer's kernels from the family registry).

The shapes, the arithmetic (:func:`gemm_flops`, :func:`gemm_bytes`, :func:`summarize`), the
JSON reader and the record `probe --measure` keeps for later plans on this machine
(:class:`KeptPerf`, keyed by :class:`GpuKey`; the cache is :mod:`launcher.pipeline.gpuperfs`) live
here; :mod:`launcher.probe.measure` runs the timing with torch.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

_T = TypeVar("_T")

PREFILL_TOKENS = 512
HIDDEN_SIZES = (4096, 5120, 8192)  # Llama-3-8B / Mistral-7B, Qwen2.5-32B / 13B, Llama-3-70B
DECODE_BATCHES = (1, 8, 32)
# the per-kernel graph cost's GEMVs: [1 x GRAPH_GEMV_K] x [GRAPH_GEMV_K x n], 4-268 MB of bf16
# weights (the range of a 1-70B model's per-layer GEMMs on one GPU)
GRAPH_GEMV_K = 4096
GRAPH_GEMV_NS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
# A fixed cost a kernel beyond this is a broken measurement (a kernel's launch gap and ramp in a
# CUDA graph are microseconds on any CUDA card)
_MAX_KERNEL_S = 1e-3
DTYPE_BYTES = 2  # bf16

# A shape: (kind, m, k, n) for an [m x k] x [k x n] matmul.
Shape = tuple[str, int, int, int]


def prefill_shapes(hidden: int, tokens: int = PREFILL_TOKENS) -> list[Shape]:
    return [("prefill", tokens, hidden, hidden), ("prefill", tokens, hidden, 4 * hidden),
            ("prefill", tokens, 4 * hidden, hidden)]


def decode_shapes(hidden: int, batches: Sequence[int] = DECODE_BATCHES) -> list[Shape]:
    return [("decode", b, hidden, 4 * hidden) for b in batches]


def default_shapes() -> list[Shape]:
    return [s for h in HIDDEN_SIZES for s in (*prefill_shapes(h), *decode_shapes(h))]


def gemm_flops(m: int, k: int, n: int) -> float:
    return 2.0 * m * k * n


def gemm_bytes(m: int, k: int, n: int, dtype_bytes: int = DTYPE_BYTES) -> float:
    """Bytes one matmul must move at least: the weights, the input and the output."""
    return float(dtype_bytes) * (k * n + m * k + m * n)


@dataclass(frozen=True)
class Sample:
    """``reps`` back-to-back matmuls of one shape, ``seconds`` for all of them."""

    kind: str  # 'prefill' | 'decode'
    m: int
    k: int
    n: int
    reps: int
    seconds: float


@dataclass(frozen=True)
class GraphSample:
    """``calls`` one-row GEMVs of a ``[1 x k] x [k x n]`` bf16 matmul captured back to back in
    one CUDA graph (each on other weights, so that none is in cache), ``seconds`` a replay."""

    k: int
    n: int
    calls: int
    seconds: float

    @property
    def weight_bytes(self) -> int:
        return self.k * self.n * DTYPE_BYTES

    @property
    def call_s(self) -> float:
        return self.seconds / self.calls


def graph_kernel_fit(samples: Sequence[GraphSample]) -> tuple[float, float] | None:
    """(seconds, GB/s): the least-squares line through the samples' per-call time against
    weight bytes, as the fixed cost of a kernel (where it crosses zero bytes) and the rate (its
    slope). None with fewer than two weight sizes, or a line whose fixed cost or rate is not
    positive (the timing was too noisy to split them)."""
    pts = [(float(s.weight_bytes), s.call_s) for s in samples if s.calls > 0 and s.seconds > 0]
    if len({b for b, _ in pts}) < 2:
        return None
    mb = math.fsum(b for b, _ in pts) / len(pts)
    mt = math.fsum(t for _, t in pts) / len(pts)
    slope = (math.fsum((b - mb) * (t - mt) for b, t in pts)
             / math.fsum((b - mb) ** 2 for b, _ in pts))
    fixed = mt - slope * mb
    if slope <= 0 or not 0 < fixed <= _MAX_KERNEL_S:
        return None
    return fixed, 1 / slope / 1e9


@dataclass(frozen=True)
class GpuPerf:
    prefill_tflops: float | None = None
    decode_gbs: float | None = None
    device: str | None = None  # what torch called it ("NVIDIA GeForce RTX 4090", "cpu")
    method: str | None = None  # how it was measured, for the record
    # every shape timed, for the record (the planner reads only the figures)
    samples: tuple[Sample, ...] = field(default=(), compare=False, repr=False)
    # a kernel's fixed cost in a CUDA-graph replay (module docstring); None: not timed
    kernel_s: float | None = None
    # its GEMVs, for the record
    graph_samples: tuple[GraphSample, ...] = field(default=(), compare=False, repr=False)
    # why ``kernel_s`` is not there (no CUDA, the capture failed, a noisy line), for the notes
    kernel_note: str | None = None

    @property
    def any(self) -> bool:
        return (self.prefill_tflops is not None or self.decode_gbs is not None
                or self.kernel_s is not None)

    def describe(self) -> str:
        parts = []
        if self.prefill_tflops is not None:
            parts.append(f"{self.prefill_tflops:,.1f} TFLOP/s at 512-token prefill GEMMs")
        if self.decode_gbs is not None:
            parts.append(f"{self.decode_gbs:,.0f} GB/s at decode GEMMs")
        if self.kernel_s is not None:
            parts.append(f"{self.kernel_s * 1e6:.2f} us a kernel in a CUDA graph")
        elif self.kernel_note:
            parts.append(f"no per-kernel graph cost ({self.kernel_note})")
        return ", ".join(parts) or "nothing measured"


def summarize(samples: Sequence[Sample], device: str | None = None,
              method: str | None = None) -> GpuPerf:
    """Total FLOPs (prefill) or bytes (decode) over total time, per kind."""

    def rate(kind: str, work: Any, scale: float) -> float | None:
        chosen = [s for s in samples if s.kind == kind and s.seconds > 0 and s.reps > 0]
        seconds = math.fsum(s.seconds for s in chosen)
        if not chosen or seconds <= 0:
            return None
        return math.fsum(work(s.m, s.k, s.n) * s.reps for s in chosen) / seconds / scale

    return GpuPerf(rate("prefill", gemm_flops, 1e12), rate("decode", gemm_bytes, 1e9),
                   device, method, tuple(samples))


# ------------------------------------------------------------------------------------- JSON

_FIELDS = ("prefill_tflops", "decode_gbs", "device", "method", "samples", "kernel_s",
           "graph_samples", "kernel_note")
# Beyond any GPU made or planned (B200: ~2.3 PFLOP/s dense BF16, 8 TB/s): a larger figure is a
# broken measurement, not a fast card.
_MAX_TFLOPS = 1e5
_MAX_GBS = 1e6


def perf_to_json(perf: GpuPerf | None) -> dict[str, Any] | None:
    if perf is None:
        return None
    data: dict[str, Any] = {"prefill_tflops": perf.prefill_tflops, "decode_gbs": perf.decode_gbs,
                            "device": perf.device, "method": perf.method}
    if perf.samples:
        data["samples"] = [vars(s) for s in perf.samples]
    if perf.kernel_s is not None:
        data["kernel_s"] = perf.kernel_s
    if perf.graph_samples:
        data["graph_samples"] = [vars(s) for s in perf.graph_samples]
    if perf.kernel_note:
        data["kernel_note"] = perf.kernel_note
    return data


def _readable(raw: Any, read: Callable[[Any], _T | None]) -> tuple[tuple[_T, ...], int]:
    """The entries of a saved list that ``read`` turns into a value (None, or a TypeError,
    KeyError, ValueError or OverflowError: unreadable), and how many were not; a value that is
    not a list is one unreadable entry (none where absent)."""
    if not isinstance(raw, list):
        return (), 0 if raw is None else 1
    good = []
    for item in raw:
        try:
            value = read(item)
        except (TypeError, KeyError, ValueError, OverflowError):
            continue
        if value is not None:
            good.append(value)
    return tuple(good), len(raw) - len(good)


def _sample(item: Any) -> Sample | None:
    m, k, n, reps = (int(item[key]) for key in ("m", "k", "n", "reps"))
    s = Sample(str(item["kind"]), m, k, n, reps, float(item["seconds"]))
    ok = s.kind in ("prefill", "decode") and min(s.m, s.k, s.n, s.reps) > 0 and s.seconds > 0
    return s if ok else None


def _graph_sample(item: Any) -> GraphSample | None:
    k, n, calls = (int(item[key]) for key in ("k", "n", "calls"))
    s = GraphSample(k, n, calls, float(item["seconds"]))
    ok = min(s.k, s.n, s.calls) > 0 and math.isfinite(s.seconds) and s.seconds > 0
    return s if ok else None


def _rate(raw: Any, hi: float) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    value = float(raw)
    return value if math.isfinite(value) and 0 < value <= hi else None


def perf_from_json(raw: Any) -> tuple[GpuPerf | None, list[str]]:
    """A saved GPU's measured figures, and what was ignored and why (total: never raises).

    Absent or null: nothing measured, nothing said. A figure that is not a positive number in
    range is ignored (the datasheet is used for it); unknown keys are ignored and named.
    """
    if raw is None:
        return None, []
    if not isinstance(raw, Mapping):
        return None, [f"measured GPU figures ignored (not an object: {type(raw).__name__})"]
    reasons = []
    unknown = sorted(repr(k)[:30] for k in raw if k not in _FIELDS)  # repr: one line
    if unknown:
        reasons.append(f"unknown measured field(s) ignored: {', '.join(unknown)[:80]}")
    figures: dict[str, float | None] = {}
    for key, hi, unit in (("prefill_tflops", _MAX_TFLOPS, "TFLOP/s"),
                          ("decode_gbs", _MAX_GBS, "GB/s")):
        value = raw.get(key)
        figures[key] = _rate(value, hi)
        if figures[key] is None and value is not None:
            text = repr(value)
            reasons.append(f"measured {key} {text[:30]} ignored (not a {unit} figure in "
                           f"(0, {hi:g}]); the datasheet figure is used")
    kernel = raw.get("kernel_s")
    kernel_s = _rate(kernel, _MAX_KERNEL_S)
    if kernel_s is None and kernel is not None:
        reasons.append(f"measured kernel_s {repr(kernel)[:30]} ignored (not seconds in "
                       f"(0, {_MAX_KERNEL_S:g}]); the shipped per-kernel figure is used")
    device, method, note = raw.get("device"), raw.get("method"), raw.get("kernel_note")
    samples, bad = _readable(raw.get("samples"), _sample)
    if bad:
        reasons.append(f"{bad} unreadable measured sample(s) ignored (a record only)")
    graph, bad = _readable(raw.get("graph_samples"), _graph_sample)
    if bad:
        reasons.append(f"{bad} unreadable graph sample(s) ignored (a record only)")
    perf = GpuPerf(figures["prefill_tflops"], figures["decode_gbs"],
                   device if isinstance(device, str) else None,
                   method if isinstance(method, str) else None, samples, kernel_s, graph,
                   note if isinstance(note, str) else None)
    return (perf if perf.any else None), reasons



# ------------------------------------------------------------------- kept for later plans here

KEPT_FORMAT = 1


@dataclass(frozen=True)
class GpuKey:
    """Which GPU a kept measurement is of: NVML's name, the driver and the card's UUID (""
    where the reading had none). Figures kept under one key are read for that key only: another
    card, even of the same model, or the same card under another driver, plans from its own."""

    name: str
    driver: str
    uuid: str

    def digest(self) -> str:
        text = json.dumps([self.name, self.driver, self.uuid])
        return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class KeptPerf:
    """One GPU's figures as `probe --measure` kept them, and when (UTC, as it was said)."""

    key: GpuKey
    measured_at: str
    perf: GpuPerf


def kept_to_json(kept: KeptPerf) -> dict[str, Any]:
    return {"format": KEPT_FORMAT, "key": asdict(kept.key), "measured_at": kept.measured_at,
            "measured": perf_to_json(kept.perf)}


def kept_from_json(raw: Any) -> tuple[KeptPerf | None, list[str]]:
    """A kept record and what was ignored and why; None with a reason when it cannot be used
    (not an object, another format, no key, nothing measured). Total: never raises."""
    if not isinstance(raw, Mapping):
        return None, [f"is not a record (a {type(raw).__name__})"]
    if raw.get("format") != KEPT_FORMAT:
        return None, [f"is of format {repr(raw.get('format'))[:20]}, not {KEPT_FORMAT}"]
    key, at = raw.get("key"), raw.get("measured_at")
    parts = [key.get(f) for f in ("name", "driver", "uuid")] if isinstance(key, Mapping) else []
    if len(parts) != 3 or not all(isinstance(p, str) for p in parts):
        return None, ["has no GPU key (name, driver, uuid)"]
    if not isinstance(at, str) or not at or len(at) > 40 or not at.isprintable():
        return None, ["has no time of measurement"]
    perf, reasons = perf_from_json(raw.get("measured"))
    if perf is None:
        return None, ["has no measured figure", *reasons]
    note = perf.kernel_note
    if note is not None and (len(note) > 200 or not note.isprintable()):
        perf = replace(perf, kernel_note=None)  # said in a one-line reason: no more than a line
    name, driver, uuid = (str(p) for p in parts)
    return KeptPerf(GpuKey(name, driver, uuid), at, perf), reasons
