"""The engine's decode step on this machine: timed by `probe --measure` where there is no GPU,
attached to this machine's topology when planning here.

Composes the stages (the embedded model from :mod:`launcher.model`, the timing and cache from
:mod:`launcher.probe.enginestep`), which the layering lets only the pipeline and the CLI do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from launcher.model.modelspec import load_model_spec
from launcher.model.tinymodel import default_cache_dir, ensure_tiny_model
from launcher.planner.costmodel import streamed_weight_bytes
from launcher.planner.plantypes import CPU_KV_CACHE_GIB
from launcher.probe import enginestep, kernelprobe, kernels
from launcher.probe.topology import Topology

# The context the step is timed at: the embedded model's whole window, as serve gives it.
MAX_MODEL_LEN = 4096


def key_here(env: Mapping[str, str]) -> enginestep.StepKey:
    """This CPU, this vLLM, this torch: a measurement from any other is not this machine's."""
    device = kernels.cpu_device_name(kernelprobe.cpuinfo(), os.cpu_count() or 1)
    return enginestep.StepKey(device, kernelprobe.vllm_version(), kernelprobe.dist_version("torch"))


def attach(topo: Topology, env: Mapping[str, str]) -> Topology:
    """``topo`` with the engine step kept for this machine, when ``topo`` is this machine's
    reading without GPUs (a saved topology is another machine's; GPUs plan from their tables)."""
    if topo.gpus or topo.source != "nvml":
        return topo
    step = enginestep.load(default_cache_dir(env), key_here(env))
    return topo if step is None else replace(topo, engine_step=step)


def measure(env: Mapping[str, str]) -> str:
    """Time the CPU engine's decode step here (the real vLLM engine on the embedded model) and
    keep it; the line to print."""
    path = ensure_tiny_model(env)
    spec = load_model_spec(str(path))
    run_env = {**env, "VLLM_TARGET_DEVICE": "cpu"}
    rec, kept = enginestep.measure(
        key_here(env), path, default_cache_dir(env), run_env, params=spec.active_params,
        weight_bytes=int(streamed_weight_bytes(spec, 1)), max_model_len=MAX_MODEL_LEN,
        kv_cache_gib=CPU_KV_CACHE_GIB)
    where = f"kept in {kept}" if kept else "not kept (the cache cannot be written)"
    return (f"engine decode step on {rec.key.device} (vLLM {rec.key.vllm}): "
            f"{rec.step_s * 1e3:.2f} ms median of {len(rec.steps_s)} rounds "
            f"({min(rec.steps_s) * 1e3:.2f}-{max(rec.steps_s) * 1e3:.2f} ms); {where}")
