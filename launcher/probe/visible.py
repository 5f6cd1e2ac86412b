"""CUDA_VISIBLE_DEVICES applied to a topology: which GPUs a process started under an
environment sees, in CUDA's order. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from launcher.probe.topotypes import Gpu, Topology


def _cuda_order(gpus: Sequence[Gpu], env: Mapping[str, str]) -> list[Gpu]:
    """GPUs in the order CUDA numbers them under ``env``.

    NVML numbers by PCI bus. CUDA does so only with CUDA_DEVICE_ORDER=PCI_BUS_ID; its default
    FASTEST_FIRST puts the newest compute capability first (ties by bus), which we imitate.
    """
    by_bus = sorted(gpus, key=lambda g: g.index)
    if env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") == "PCI_BUS_ID":
        return by_bus
    return sorted(by_bus, key=lambda g: (-(g.cc or (0, 0))[0], -(g.cc or (0, 0))[1]))


def visible_gpus(gpus: Sequence[Gpu], env: Mapping[str, str]) -> tuple[list[Gpu], list[str]]:
    """The GPUs CUDA_VISIBLE_DEVICES selects, in its order, and notes about what was dropped.

    Entries are CUDA indices (numbered as :func:`_cuda_order` says), or UUIDs / unique UUID
    prefixes (``GPU-8a1f``). Like CUDA, parsing stops at the first entry that names no device.
    """
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return list(gpus), []
    ordered = _cuda_order(gpus, env)
    chosen: list[Gpu] = []
    for entry in (e.strip() for e in cvd.split(",")):
        found = _match_entry(entry, ordered)
        if found is None or found in chosen:
            return chosen, [
                f"CUDA_VISIBLE_DEVICES={cvd!r}: entry {entry!r} names no GPU; "
                "CUDA ignores it and every entry after it"
            ]
        chosen.append(found)
    return chosen, []


def _match_entry(entry: str, ordered: Sequence[Gpu]) -> Gpu | None:
    if entry.lstrip("-").isdigit():
        i = int(entry)
        return ordered[i] if 0 <= i < len(ordered) else None
    matches = [g for g in ordered if g.uuid.upper().startswith(entry.upper()) and entry]
    return matches[0] if len(matches) == 1 else None


def apply_visible_devices(topo: Topology, env: Mapping[str, str]) -> Topology:
    """Keep the GPUs (and pairs) that ``CUDA_VISIBLE_DEVICES`` in ``env`` lets a process see."""
    if "CUDA_VISIBLE_DEVICES" not in env:
        return topo
    kept, notes = visible_gpus(topo.gpus, env)
    keep = {g.index for g in kept}
    note = f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r} keeps GPUs {sorted(keep)}"
    return replace(
        topo,
        gpus=tuple(g for g in topo.gpus if g.index in keep),
        pairs=tuple(p for p in topo.pairs if p.a in keep and p.b in keep),
        notes=(*topo.notes, note, *notes),
    )
