"""The planning options of every command that plans (plan, serve, tune), and the one Policy
built from them, so that `serve` and `tune` can plan whatever `plan` plans, the same way."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from launcher.cli import argtypes
from launcher.errors import PlanError
from launcher.planner import hardware
from launcher.planner.plantypes import CPU_KV_CACHE_GIB, WORKLOADS, Policy


def add_planning_arguments(p: argparse.ArgumentParser, *, model_help: str,
                           model_required: bool = False) -> None:
    p.add_argument("--model", type=argtypes.model_ref, required=model_required, help=model_help)
    p.add_argument("--revision", help="branch, tag or commit of a hub model (default: main)")
    p.add_argument("--topology", metavar="FILE",
                   help="saved topology (probe --save, or an NVML dump) instead of NVML")
    p.add_argument("--workload", choices=WORKLOADS, default="interactive",
                   help="interactive: one agent, latency first (default); throughput: many "
                   "streams")
    p.add_argument("--concurrency", type=argtypes.count,
                   help="streams to expect (default 1 interactive, 32 throughput)")
    p.add_argument("--max-model-len", type=argtypes.count,
                   help="context length to guarantee (default: the longest that fits)")
    p.add_argument("--prompt", type=argtypes.count, default=512,
                   help="prompt tokens of a typical request (default 512)")
    p.add_argument("--gen", type=argtypes.count, default=256,
                   help="generated tokens of a typical request (default 256)")
    p.add_argument("--gpu-memory-utilization", type=argtypes.fraction, default=0.9,
                   help="share of each GPU's memory vLLM may take (default 0.9)")
    p.add_argument("--tp", type=argtypes.count, help="force the tensor-parallel size")
    p.add_argument("--pp", type=argtypes.count,
                   help="force the pipeline-parallel (layer split) size")
    p.add_argument("--dp", type=argtypes.count, help="force the number of data-parallel replicas")
    p.add_argument("--nodes", type=argtypes.count, default=1,
                   help="plan for this many identical nodes (Ray)")
    p.add_argument("--gpus-per-node", type=argtypes.count,
                   help="GPUs used on each node (default: all of the topology)")
    p.add_argument("--network-gbps", type=argtypes.positive, default=100.0,
                   help="link between nodes in Gbit/s (default 100: 100G Ethernet/RoCE)")


def policy_from_args(args: argparse.Namespace) -> Policy:
    kv_bytes, fp8_weights, offload = engine_memory_flags(extra_args(args))
    return Policy(
        workload=args.workload,
        concurrency=args.concurrency,
        max_model_len=args.max_model_len,
        prompt_tokens=args.prompt,
        gen_tokens=args.gen,
        gpu_memory_utilization=args.gpu_memory_utilization,
        force_tp=args.tp,
        force_pp=args.pp,
        force_dp=args.dp,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        internode_gbs=args.network_gbps / 8 * hardware.NETWORK_EFFICIENCY,
        cpu_cores=os.cpu_count() or 1,
        cpu_kv_cache_gib=cpu_kv_cache_gib(os.environ),
        kv_cache_bytes=kv_bytes,
        fp8_weights=fp8_weights,
        cpu_offload_gib=offload,
    )


def _last_value(args: Sequence[str], flag: str) -> str | None:
    """The value of the last ``flag V`` or ``flag=V`` in ``args`` (vLLM takes the last)."""
    found = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith(flag + "="):
            found = a[len(flag) + 1:]
    return found


def engine_memory_flags(extra: Sequence[str]) -> tuple[int, bool, float]:
    """(KV bytes per element, FP8 weights, GiB offloaded per GPU) from the user's own vLLM
    flags: what the planner must size with, or it would refuse what they make fit."""
    kv = (_last_value(extra, "--kv-cache-dtype") or "auto").lower()
    quant = (_last_value(extra, "--quantization") or _last_value(extra, "-q") or "").lower()
    raw = _last_value(extra, "--cpu-offload-gb")
    try:
        offload = float(raw) if raw is not None else 0.0
    except ValueError:
        offload = -1.0
    if not 0 <= offload < float("inf"):
        raise PlanError(f"--cpu-offload-gb {raw!r} (after --): vLLM takes GiB per GPU, a number "
                        "0 or more")
    return (1 if kv.startswith("fp8") else 2), quant == "fp8", offload


def cpu_kv_cache_gib(env: Mapping[str, str]) -> float:
    """The KV cache the CPU engine will get: the user's VLLM_CPU_KVCACHE_SPACE (GiB) when it is a
    positive number, else what render gives it, so that the planned context is the one vLLM
    can hold."""
    raw = env.get("VLLM_CPU_KVCACHE_SPACE", "").strip()
    try:
        value = float(raw)
    except ValueError:
        return CPU_KV_CACHE_GIB
    return value if 0 < value < float("inf") else CPU_KV_CACHE_GIB


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """What shapes the engine command beyond the plan; `plan` takes them too, so that it prints
    the command `serve` runs for the same options."""
    p.add_argument("--served-model-name", type=argtypes.name,
                   help="name clients use (default: the model's)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let vLLM run code shipped with the model (off unless asked)")
    p.add_argument("--ray-address", type=argtypes.host_port,
                   help="run vLLM on an existing Ray cluster (HEAD:PORT)")
    p.add_argument("extra", nargs=argparse.REMAINDER,
                   help="after --: extra arguments passed to vLLM as they are, last")


def cpu_ids() -> tuple[int, ...]:
    """The CPUs this process may run on (what a CPU engine's workers are spread over)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return tuple(range(os.cpu_count() or 1))


def extra_args(args: argparse.Namespace) -> tuple[str, ...]:
    given = list(getattr(args, "extra", None) or [])
    # argparse keeps the "--" that ends our own options; it is not one of vLLM's arguments.
    return tuple(given[1:] if given[:1] == ["--"] else given)
