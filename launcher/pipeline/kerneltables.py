"""Kernel tables for the commands: measured by `probe --measure --model M`, found by a plan.

Composes the stages (the model's shape from :mod:`launcher.planner.kernelcost`, the timing
and cache from :mod:`launcher.probe.kernelprobe`), which the layering lets only the pipeline and
the CLI above it do.
A GPU machine's tables are timed on its first GPU of each name, for every TP degree its GPUs
allow; a machine without GPUs times the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping

from launcher.model.modelspec import ModelSpec
from launcher.model.tinymodel import default_cache_dir
from launcher.planner.kernelcost import step_shape
from launcher.probe import kernelprobe
from launcher.probe.kernels import KernelTable, TableKey
from launcher.probe.topology import Gpu, Topology

TP_DEGREES = (1, 2, 4, 8)


def _gpu_keys(m: ModelSpec, topo: Topology) -> list[tuple[Gpu, TableKey]]:
    firsts = {g.name: g for g in reversed(topo.gpus)}
    out = []
    for g in firsts.values():
        for tp in TP_DEGREES:
            if tp <= len(topo.gpus) and m.num_heads % tp == 0:
                out.append((g, kernelprobe.gpu_key(step_shape(m, tp), g, topo.driver)))
    return out


def measure(m: ModelSpec, topo: Topology, env: Mapping[str, str]) -> list[str]:
    """Time and keep the model's tables on this machine; one line per table."""
    cache = default_cache_dir(env)
    lines = []
    if not topo.gpus:
        key = kernelprobe.cpu_key(step_shape(m))
        table, path = kernelprobe.measure_cpu(step_shape(m), key, cache)
        lines.append(_line(m, table, path))
        return lines
    for g, key in _gpu_keys(m, topo):
        shape = step_shape(m, _tp_of(m, key))
        table, path = kernelprobe.measure_gpu(shape, key, g, cache, env)
        lines.append(_line(m, table, path))
    return lines


def _tp_of(m: ModelSpec, key: TableKey) -> int:
    return next(tp for tp in TP_DEGREES if step_shape(m, tp).key() == key.shape)


def _line(m: ModelSpec, table: KernelTable, path: object) -> str:
    where = f"kept in {path}" if path else "not kept (the cache cannot be written)"
    return (f"kernel table for {m.name} on {table.key.device}: {len(table.times)} timings "
            f"({table.method}); {where}")


def cached(m: ModelSpec, topo: Topology, env: Mapping[str, str]
           ) -> tuple[tuple[KernelTable, ...], tuple[str, ...]]:
    """The tables `probe --measure --model` kept for this model on this machine, and a line
    for each kept file that cannot be used (the plan's reasons say it)."""
    cache = default_cache_dir(env)
    if not topo.gpus:
        keys = [kernelprobe.cpu_key(step_shape(m))]
    else:
        keys = [k for _, k in _gpu_keys(m, topo)]
    found = [kernelprobe.cached_table(cache, k) for k in keys]
    return (tuple(t for t, _ in found if t is not None),
            tuple(dict.fromkeys(why for _, why in found if why)))
