"""Answers the candidate search has already worked out, kept for the rest of one plan. Pure.

The search (:mod:`launcher.planner.layouts`) tries every GPU subset of every shape: on an
8-GPU box some 900 layouts a plan, most of them the same cards joined the same way under other
GPU numbers. The memory fit and the predictions are figures about *what* the cards are and how
they are joined (their model, memory, measured rates, links, the host), never about which
numbers, UUIDs or bus addresses they carry; so each is computed once per distinct layout and
read back for the others. The key of a layout is every field the cost model is handed, with each
GPU replaced by its :meth:`SearchMemo.kind` (the GPU without those three names): a field added
to :class:`~launcher.planner.costmodel.Layout` or to :class:`~launcher.probe.topotypes.Gpu` is in
the key without a change here. tests/launcher/test_searchmemo.py checks on generated layouts
that the memoised answers are the direct ones, and that renumbering the GPUs changes no figure.

Objects keyed by identity (the model, the kernel tables) are held by the memo, so their ids
cannot be reused while it lives; it lives as long as one plan's :class:`~layouts.Links`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import fields, replace
from typing import Any, TypeVar

from launcher.model.modelspec import ModelSpec
from launcher.planner import costmodel, kernelcost, memfit
from launcher.planner.costmodel import Layout, Prediction
from launcher.planner.cudagraphs import CudaGraphs
from launcher.probe.kernels import KernelTable
from launcher.probe.topotypes import Gpu

T = TypeVar("T")


def unnamed(g: Gpu) -> Gpu:
    """``g`` without its names (number, UUID, bus address): where it sits, not what it is.
    Nothing the cost model or the memory fit computes reads them."""
    return replace(g, index=-1, uuid="", bus_id="")

_LAYOUT_FIELDS = tuple(f.name for f in fields(Layout))


class SearchMemo:
    """One plan's memory fits and predictions, keyed by what the GPUs are, not their numbers."""

    def __init__(self) -> None:
        self._kind_of: dict[int, tuple[Gpu, int]] = {}  # id(gpu) -> (gpu, kind)
        self._kinds: dict[Gpu, int] = {}  # the GPU without its names -> kind
        self._held: dict[int, object] = {}  # objects keyed by id, kept alive
        self._answers: dict[Hashable, Any] = {}

    def kind(self, g: Gpu) -> int:
        """A small number equal for two GPUs that differ in nothing but their names."""
        found = self._kind_of.get(id(g))
        if found is not None and found[0] is g:
            return found[1]
        k = self._kinds.setdefault(unnamed(g), len(self._kinds))
        self._kind_of[id(g)] = (g, k)
        return k

    def _id(self, obj: object) -> int:
        self._held[id(obj)] = obj
        return id(obj)

    def _get(self, key: Hashable, compute: Callable[[], T]) -> T:
        if key in self._answers:
            return self._answers[key]  # type: ignore[no-any-return]
        value = compute()
        self._answers[key] = value
        return value

    def layout_key(self, lay: Layout) -> tuple[Hashable, ...]:
        return tuple(
            tuple(tuple(self.kind(g) for g in stage) for stage in lay.stages)
            if name == "stages" else getattr(lay, name)
            for name in _LAYOUT_FIELDS
        )

    def fit(self, m: ModelSpec, gpus: Sequence[Gpu], tp: int, pp: int, util: float,
            kv_dtype_bytes: int, offload: float, graphs: CudaGraphs | None = None) -> memfit.Fit:
        key = ("fit", self._id(m), tuple(self.kind(g) for g in gpus), tp, pp, util,
               kv_dtype_bytes, offload, graphs)
        return self._get(key, lambda: memfit.fit(m, gpus, tp, pp, util, kv_dtype_bytes,
                                                 offload, graphs))

    def need_per_gpu(self, f: memfit.Fit, m: ModelSpec, tp: int, pp: int, tokens: int) -> float:
        key = ("need", self._id(m), f, tp, pp, tokens)
        return self._get(key, lambda: memfit.need_per_gpu(f, m, tp, pp, tokens))

    def sequences_held(self, m: ModelSpec, f: memfit.Fit, tokens: int) -> int:
        key = ("held", self._id(m), f, tokens)
        return self._get(key, lambda: memfit.sequences_held(m, f, tokens))

    def layout_prediction(
        self, m: ModelSpec, tables: Sequence[KernelTable], lay: Layout, *, batched_tokens: int,
        max_num_seqs: int, prompt: int, gen: int, concurrency: int, kv_dtype_bytes: int,
    ) -> tuple[Prediction, KernelTable] | None:
        key = ("table", self._id(m), self._id(tables), self.layout_key(lay), batched_tokens,
               max_num_seqs, prompt, gen, concurrency, kv_dtype_bytes)
        return self._get(key, lambda: kernelcost.layout_prediction(
            m, tables, lay, batched_tokens=batched_tokens, max_num_seqs=max_num_seqs,
            prompt=prompt, gen=gen, concurrency=concurrency, kv_dtype_bytes=kv_dtype_bytes))

    def predict(self, m: ModelSpec, lay: Layout, *, prompt: int, gen: int, concurrency: int,
                kv_sequences: int, max_num_seqs: int, batched_tokens: int) -> Prediction:
        key = ("roofline", self._id(m), self.layout_key(lay), prompt, gen, concurrency,
               kv_sequences, max_num_seqs, batched_tokens)
        return self._get(key, lambda: costmodel.predict(
            m, lay, prompt=prompt, gen=gen, concurrency=concurrency, kv_sequences=kv_sequences,
            max_num_seqs=max_num_seqs, batched_tokens=batched_tokens))
