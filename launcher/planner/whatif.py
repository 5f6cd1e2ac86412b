"""When nothing fits: what would, each with the context length it would give. Pure.

Every alternative is sized with the same memory model (:mod:`launcher.planner.memfit`) as the plan,
so
the context lengths it names are computed, not guessed: FP8 weights, an FP8 KV cache, 4-bit
weights, more GPUs like these as TP, and CPU offload of part of the weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from launcher.model.modelspec import GIB, ModelSpec
from launcher.planner import memfit
from launcher.planner.cudagraphs import Requested
from launcher.planner.plantypes import MIN_CONTEXT, Candidate, gib, label
from launcher.probe.topology import Gpu

TP_SIZES = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Option:
    what: str  # how to say it
    context: int  # the max_model_len it would give (0: it does not fit either)


def variant(m: ModelSpec, bits: float) -> ModelSpec:
    """The same model with its linear layers in ``bits`` per weight (tables stay 16-bit)."""
    tables = memfit.table_bytes(m)
    linear_params = m.params - tables // 2
    group_overhead = 0.03 if bits < 8 else 0.0  # a scale and a zero per 128-weight group
    return replace(
        m,
        weight_bytes=int(linear_params * bits / 8 * (1 + group_overhead) + tables),
        quantization=f"{bits:g}-bit",
        weight_bits=bits,
    )


def _context(
    m: ModelSpec,
    gpus: Sequence[Gpu],
    tp: int,
    pp: int,
    util: float,
    *,
    kv_bytes: int = 2,
    offload: float = 0.0,
    graphs: Requested | None = None,
) -> int:
    # the offloaded weights counted where every plan counts them: memfit.fit, with the served
    # engine's graphs on these GPUs (None: vLLM's default, and the logged release's rule)
    on = graphs.on(g.cc for g in gpus) if graphs is not None else None
    f = memfit.fit(m, gpus, tp, pp, util, kv_bytes, offload, on)
    return f.context if f.kv_budget > 0 else 0


def options(
    m: ModelSpec, gpus: Sequence[Gpu], best: Candidate, util: float, wanted: int,
    kv_bytes: int = 2, *, graphs: Requested | None = None,
) -> list[Option]:
    """Alternatives to the closest candidate ``best`` (on ``gpus``), each with its context;
    ``kv_bytes`` 1 when the KV cache is FP8 already (then it is not offered again); ``graphs``:
    the served engine's (Policy.cuda_graphs; None: vLLM's default), as the plan sized them."""
    tp, pp = best.tp, best.pp
    used = [g for g in gpus if g.index in best.gpus] or list(gpus)
    out: list[Option] = []
    where = label(best)
    if m.weight_bits > 8:
        ctx = _context(variant(m, 8.0), used, tp, pp, util, kv_bytes=kv_bytes, graphs=graphs)
        out.append(
            Option(
                f"FP8 weights (~{gib(variant(m, 8.0).weight_bytes)} GiB: `-- --quantization "
                f"fp8`) on {where}",
                ctx,
            )
        )
    if kv_bytes == 2:
        ctx = _context(m, used, tp, pp, util, kv_bytes=1, graphs=graphs)
        out.append(Option(f"an FP8 KV cache (`-- --kv-cache-dtype fp8`) on {where}", ctx))
    if m.weight_bits > 4:
        v = variant(m, 4.0)
        out.append(
            Option(
                f"a 4-bit AWQ/GPTQ variant (~{gib(v.weight_bytes)} GiB) on {where}",
                _context(v, used, tp, pp, util, kv_bytes=kv_bytes, graphs=graphs),
            )
        )
    card = min(gpus, key=lambda g: g.memory_bytes)
    for k in TP_SIZES:
        if k <= len(gpus) or m.num_heads % k:
            continue
        ctx = _context(m, [card] * k, k, 1, util, kv_bytes=kv_bytes, graphs=graphs)
        if ctx >= min(wanted, m.max_position_embeddings):
            out.append(Option(f"{k} GPUs like these as TP={k}", ctx))
            break
    # the candidate's own fit, as the plan judged it (with any --cpu-offload-gb given already)
    f = best.fit
    if f is None:
        return out
    short = memfit.need_per_gpu(f, m, tp, pp, min(wanted, m.max_position_embeddings)) - f.budget
    held = f.weights
    # Offloading can take no more than the weights a GPU holds: where even all of them leave
    # the rest too big, no offload is offered; the whole GiB it is rounded up to is capped there.
    if 0 < short <= held:
        more = min(float(-(-short // GIB)), math.floor(held / GIB * 10) / 10)
        gb = round(f.offload / GIB + more, 1)
        ctx = _context(m, used, tp, pp, util, kv_bytes=kv_bytes, offload=gb * GIB,
                       graphs=graphs)
        out.append(
            Option(
                f"CPU offload of {gb:g} GiB of weights per GPU "
                f"(`-- --cpu-offload-gb {gb:g}`; each step then streams them over PCIe)",
                ctx,
            )
        )
    return out


def say(options_: Sequence[Option], wanted: int) -> list[str]:
    """Options that reach at least the wanted context (or MIN_CONTEXT), best first."""
    need = min(wanted, MIN_CONTEXT)
    good = [o for o in options_ if o.context >= need]
    return [f"{o.what}: --max-model-len {o.context}" for o in good]
