"""Each GPU's GEMM rates as `probe --measure` timed them, kept for later plans on this machine.

`probe --measure` keeps each GPU's measured figures (:class:`gpuperf.KeptPerf`) in the cache
(``<cache>/gpu-perf/<key digest>.json``, beside the host timing's ``host-cost/``), keyed by the
card's NVML name, the driver and its UUID (:class:`gpuperf.GpuKey`); a plan made here from a live
NVML reading gives each GPU the figures kept for that very key (:func:`attach`), and says so. A
saved topology (``--topology FILE``) is another machine's and carries its own figures, so it
reads none of these. A kept file that cannot be used leaves the GPU on the datasheet table, with
a reason line.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.model.tinymodel import default_cache_dir
from launcher.probe import gpuperf, keptrecord
from launcher.probe.keptrecord import write_cache_json
from launcher.probe.topology import Gpu, Topology

# The largest kept record read (a probe's record with every sample is ~5 kB)
_MAX_BYTES = 1 << 20


def gpu_key(g: Gpu, topo: Topology) -> gpuperf.GpuKey:
    return gpuperf.GpuKey(g.name, topo.driver or "", g.uuid or "")


def cache_path(cache_dir: Path, key: gpuperf.GpuKey) -> Path:
    return cache_dir / "gpu-perf" / f"{key.digest()}.json"


def keep(topo: Topology, env: Mapping[str, str], now: str | None = None) -> list[str]:
    """Keep every measured GPU's figures of ``topo`` (this machine's reading, just measured)
    for later plans here; a line for each, saying where (or that the cache cannot be written)."""
    at = now or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cache, lines = default_cache_dir(env), []
    for g in topo.gpus:
        if g.perf is None:
            continue
        kept = gpuperf.KeptPerf(gpu_key(g, topo), at, g.perf)
        path = write_cache_json(cache_path(cache, kept.key), gpuperf.kept_to_json(kept))
        where = (f"kept in {path} for plans made on this machine (this GPU, driver "
                 f"{kept.key.driver or 'unknown'})" if path else
                 "not kept (the cache cannot be written): pass --save FILE and plan with "
                 "--topology FILE")
        lines.append(f"GPU{g.index} measured figures {where}")
    return lines


def _parse(raw: Any) -> tuple[gpuperf.KeptPerf, list[str]]:
    """A kept record and the notes on what of it was ignored; ValueError (the reasons, one
    line) where it cannot be used."""
    kept, reasons = gpuperf.kept_from_json(raw)
    if kept is None:
        raise ValueError("; ".join(reasons))
    return kept, reasons


_Kept = tuple[gpuperf.KeptPerf, list[str]]
KEPT: keptrecord.Kind[_Kept, gpuperf.GpuKey] = keptrecord.Kind(
    "the file `probe --measure` kept its figures in", "planned from the datasheet table",
    _parse, lambda got: got[0].key, max_bytes=_MAX_BYTES)


def _load(cache_dir: Path, key: gpuperf.GpuKey, gpu: int
          ) -> tuple[gpuperf.KeptPerf | None, list[str]]:
    """The figures kept for ``key`` (GPU ``gpu``) and the notes to say: what of them was
    ignored, or the one line why a kept file cannot be used; (None, []) where none was kept."""
    kind = replace(KEPT, what=f"GPU{gpu}: {KEPT.what}")
    found = keptrecord.read(kind, cache_path(cache_dir, key), key)
    if found[0] is None:
        return None, [found[1]] if found[1] else []
    return found[0]


def attach(topo: Topology, env: Mapping[str, str]) -> Topology:
    """``topo`` with each GPU's kept figures, where ``topo`` is this machine's live NVML reading
    and the GPU has no measured figures of its own; a note per GPU on where its figures came
    from, or why a kept file was not used (the datasheet table then)."""
    if topo.source != "nvml" or not topo.gpus:
        return topo
    cache, gpus, notes = default_cache_dir(env), [], []
    for g in topo.gpus:
        if g.perf is not None:
            gpus.append(g)
            continue
        kept, reasons = _load(cache, gpu_key(g, topo), g.index)
        if kept is None:
            notes += reasons  # a file was there and cannot be used: its one line
            gpus.append(g)
            continue
        notes += [f"GPU{g.index}: kept figures: {r[:160]}" for r in reasons]
        notes.append(f"GPU{g.index}: planned from figures measured on it by probe --measure at "
                     f"{kept.measured_at} ({kept.perf.describe()}), not the datasheet table")
        gpus.append(replace(g, perf=kept.perf))
    if not notes:
        return topo
    return replace(topo, gpus=tuple(gpus), notes=(*topo.notes, *notes))
