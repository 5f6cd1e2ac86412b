"""A kernel table's gaps filled with the roofline's figures. Pure.

A table says which of its operations it does not time with the engine's own kernel
(``KernelTable.untimed``: a 4-bit GEMM where vLLM's mixed-input kernel would not run in the
probe, latent attention's decode where only a stand-in ran, a shape that lacks the dims to time
it). Timing such an op with something else and trusting it is how the H200's third table went
wrong (MLA decode through SDPA's math kernel: 2.8 ms a layer where the engine's kernel takes a
few microseconds), so for those ops the plan takes the roofline's own figure
(:mod:`launcher.planner.costmodel`, the same terms its roofline plans use) and says so.
"""

from __future__ import annotations

from dataclasses import replace

from launcher.model.modelspec import ModelSpec
from launcher.planner.costmodel import (
    Layout,
    _mem_bytes_s,
    _prefill_flops_s,
    attention_s,
    attention_work,
    causal_pairs,
    weight_stream_efficiency,
)
from launcher.probe.kernels import (
    DECODE_BATCH,
    DECODE_CONTEXTS,
    PREFILL_CONTEXTS,
    KernelTable,
    KernelTime,
    Linear,
)

# The line a filled table carries in its notes (the plan's speed line repeats it).
ROOFLINE_NOTE = "from the roofline (no engine kernel timed in this table)"
_PAIRS_AT = 2048  # a prompt whose attention gives the roofline's cost of a (query, key) pair
_KEYS_AT = 8192  # a decode context whose attention gives its cost of a cached token


def roofline_linear_s(m: ModelSpec, lay: Layout, lin: Linear, tokens: int) -> float:
    """The roofline's time for one rank's ``lin`` over ``tokens`` rows: its FLOPs at the card's
    prefill rate or its weights' read (4-bit with their group scales and zero points, at the
    mixed-input kernel's streaming share: costmodel.weight_stream_efficiency), the longer."""
    gpus = lay.gpus
    flops = 2.0 * tokens * lin.k * lin.n
    per_weight = lin.weight_bits / 8 + (2.5 / 128 if lin.weight_bits == 4 else 0.0)
    memory = lin.k * lin.n * per_weight / (weight_stream_efficiency(m, tokens, gpus)
                                           * _mem_bytes_s(gpus))
    return max(flops / _prefill_flops_s(gpus), memory)


def roofline_filled(m: ModelSpec, table: KernelTable, lay: Layout) -> KernelTable:
    """``table`` with every op in its ``untimed`` timed by the roofline instead (graph-replayed
    and eager alike; attention per layer, the model's layers' share); the same table where
    nothing is untimed. Filling twice gives the same table."""
    if not table.untimed:
        return table
    s = table.shape
    ladder = sorted({t.tokens for t in table.times if t.op == "norm"})
    eager = any(t.op.startswith("eager:") for t in table.times)
    kept = [t for t in table.times if t.op.removeprefix("eager:") not in table.untimed]
    filled: list[KernelTime] = []
    layers = max(1, m.num_layers)
    for op in table.untimed:
        lin = next((x for x in s.linears if f"linear:{x.name}" == op), None)
        if lin is not None:
            filled += [KernelTime(op, n, roofline_linear_s(m, lay, lin, n)) for n in ladder]
        elif op == "attn:prefill":
            pairs = causal_pairs(_PAIRS_AT, 0)
            per = attention_s(m, lay, attention_work(m, _PAIRS_AT, pairs=pairs)) / pairs / layers
            filled += [KernelTime(op, ctx, per * causal_pairs(ctx, 0), ctx, g)
                       for g in range(len(s.attention)) for ctx in PREFILL_CONTEXTS]
        elif op == "attn:decode":
            per = attention_s(m, lay, attention_work(m, 1, pairs=_KEYS_AT)) / _KEYS_AT / layers
            filled += [KernelTime(op, DECODE_BATCH, per * DECODE_BATCH * ctx, ctx, g)
                       for g in range(len(s.attention)) for ctx in DECODE_CONTEXTS]
    if eager:
        filled += [replace(t, op=f"eager:{t.op}") for t in filled]
    note = f"{ROOFLINE_NOTE}: {', '.join(table.untimed)}"
    notes = table.notes if note in table.notes else (*table.notes, note)
    return replace(table, times=tuple(kept + filled), notes=notes)
