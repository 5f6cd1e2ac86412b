"""The planning options of every command that plans (plan, serve, tune), and the one Policy
built from them, so that `serve` and `tune` can plan whatever `plan` plans, the same way."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from launcher.cli import agentopts, argtypes
from launcher.engine import detect
from launcher.engine.enginecmd import NodePlace
from launcher.engine.vllmflags import last_value
from launcher.errors import LauncherError, PlanError
from launcher.pipeline.requests import EngineRequest, PlanRequest
from launcher.planner import hardware
from launcher.planner.plantypes import WORKLOADS, Policy
from topocommon import jsontext

DEFAULT_MASTER_PORT = 29500  # torch.distributed's usual one


def add_planning_arguments(p: argparse.ArgumentParser, *, model_help: str,
                           model_required: bool = False,
                           concurrency_help: str | None = None) -> None:
    p.add_argument("--model", type=argtypes.model_ref, required=model_required, help=model_help)
    p.add_argument("--revision", type=argtypes.nonempty,
                   help="branch, tag or commit of a hub model (default: main)")
    p.add_argument("--topology", metavar="FILE", type=argtypes.nonempty,
                   help="saved topology (probe --save, or an NVML dump) instead of NVML")
    p.add_argument("--host-timing", metavar="FILE", type=argtypes.nonempty,
                   help="the serving host's front-end timing `probe --measure` kept on that "
                   "host (its cache's host-cost/*.json), for planning it from a saved "
                   "--topology here (default: this machine's, or the shipped profile)")
    p.add_argument("--workload", choices=(*WORKLOADS, agentopts.AGENT), default="interactive",
                   help="interactive: one agent, latency first (default); throughput: many "
                   "streams; agent: --sessions S keeping --context D tokens each warm")
    agentopts.add_agent_arguments(p)
    p.add_argument("--concurrency", type=argtypes.count, help=concurrency_help
                   or "streams to expect (default 1 interactive, 32 throughput)")
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
                   help="plan for this many identical nodes: TP inside a node, PP across them")
    p.add_argument("--gpus-per-node", type=argtypes.count,
                   help="GPUs used on each node (default: all of the topology)")
    p.add_argument("--network-gbps", type=argtypes.positive, default=100.0,
                   help="link between nodes in Gbit/s (default 100: 100G Ethernet/RoCE)")


def plan_request(args: argparse.Namespace, engine: EngineRequest) -> PlanRequest:
    """The plan the options ask for (plan, serve and tune's base request), typed."""
    ask = agentopts.agent_ask(args)
    return PlanRequest(
        model=args.model, policy=policy_from_args(args, engine.extra_args), engine=engine,
        revision=args.revision, topology=args.topology, host_timing=args.host_timing,
        agent=ask,
        host_free_bytes=agentopts.free_memory(os.environ) if ask else None)


def engine_request(args: argparse.Namespace, *, host: str, port: int | None) -> EngineRequest:
    """The engine options of plan and serve (add_engine_arguments), typed; ``host`` and
    ``port``: where vLLM listens (None: a free port)."""
    domains = tuple(d.strip() for d in (args.allowed_media_domains or "").split(",")
                    if d.strip())
    return EngineRequest(
        served_name=args.served_model_name, host=host, port=port, extra_args=extra_args(args),
        trust_remote_code=args.trust_remote_code, ray_address=args.ray_address,
        place=node_place(args), cpu_ids=cpu_ids(), media_domains=domains,
        allow_internal_media=args.allow_internal_media)


def policy_from_args(args: argparse.Namespace, extra: Sequence[str] | None = None) -> Policy:
    """The Policy the options ask for. ``extra``: the vLLM flags the engine gets (default: the
    ones after --), whose memory settings the planner must size with."""
    flags = extra_args(args) if extra is None else extra
    kv_bytes, fp8_weights, offload = engine_memory_flags(flags)
    return Policy(
        # an agent workload is planned as an interactive one, then for its sessions' KV room
        # (cli/agentopts.py)
        workload="interactive" if args.workload == agentopts.AGENT else args.workload,
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
        graph_tokens=engine_graph_tokens(flags),
        vllm=detect.served_vllm(os.environ),
        kv_cache_given=(last_value(flags, "--kv-cache-dtype") or "auto").lower() != "auto",
    )


def engine_memory_flags(extra: Sequence[str]) -> tuple[int, bool, float]:
    """(KV bytes per element, FP8 weights, GiB offloaded per GPU) from the user's own vLLM
    flags: what the planner must size with, or it would refuse what they make fit."""
    kv = (last_value(extra, "--kv-cache-dtype") or "auto").lower()
    quant = (last_value(extra, "--quantization") or last_value(extra, "-q") or "").lower()
    raw = last_value(extra, "--cpu-offload-gb")
    try:
        offload = float(raw) if raw is not None else 0.0
    except ValueError:
        offload = -1.0
    if not 0 <= offload < float("inf"):
        raise PlanError(f"--cpu-offload-gb {raw!r} (after --): vLLM takes GiB per GPU, a number "
                        "0 or more")
    return (1 if kv.startswith("fp8") else 2), quant == "fp8", offload


_GRAPH_KEYS = ("cudagraph_mode", "cudagraph_capture_sizes", "max_cudagraph_capture_size")


def engine_graph_tokens(extra: Sequence[str]) -> int | None:
    """The largest step (in tokens) the engine runs from a captured CUDA graph, as the user's
    own vLLM flags set it: 0 with ``--enforce-eager`` or ``cudagraph_mode`` NONE, the largest
    of ``cudagraph_capture_sizes`` (else ``max_cudagraph_capture_size``) from
    ``--compilation-config``/``-O`` JSON, vLLM's dotted ``-O.key=value`` or
    ``--cuda-graph-sizes``; None: vLLM's default (:attr:`Policy.graph_steps`). What cannot be
    read is left to that default: vLLM itself refuses it at start-up."""
    if "--enforce-eager" in extra:
        return 0
    config: dict[str, object] = {}
    raw = last_value(extra, "--compilation-config") or last_value(extra, "-O")
    parsed = _json(raw) if raw is not None else None
    if isinstance(parsed, dict):
        config.update(parsed)
    for i, a in enumerate(extra):
        for prefix in ("-O.", "--compilation-config."):
            key, sep, value = a.removeprefix(prefix).partition("=")
            if a.startswith(prefix) and key in _GRAPH_KEYS:
                config[key] = _json(value) if sep else (
                    _json(extra[i + 1]) if i + 1 < len(extra) else None)
        if a == "--cuda-graph-sizes":  # nargs="+": the numbers up to the next flag
            listed = []
            for v in extra[i + 1:]:
                if v.startswith("-"):
                    break
                listed += v.replace(",", " ").split()
            config["cudagraph_capture_sizes"] = listed
    if str(config.get("cudagraph_mode", "")).upper() in ("NONE", "0"):
        return 0
    sizes = config.get("cudagraph_capture_sizes")
    if isinstance(sizes, list) and sizes:
        found = [_whole(x) for x in sizes]
        return max(x for x in found if x is not None) if None not in found else None
    return _whole(config.get("max_cudagraph_capture_size"))


def _json(text: str) -> object:
    try:
        return jsontext.loads(text)
    except ValueError:
        return text


def _whole(raw: object) -> int | None:
    """A count of tokens from JSON or a flag's text: a whole number 0..2**20, else None."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, str):
        try:
            raw = int(raw.strip())
        except ValueError:
            return None
    return raw if isinstance(raw, int) and 0 <= raw <= 1 << 20 else None


def cpu_kv_cache_gib(env: Mapping[str, str]) -> float | None:
    """The user's VLLM_CPU_KVCACHE_SPACE (GiB) when it is a positive number, which the CPU
    engine will get, so that the planned context is the one vLLM can hold; else None: the plan
    sizes the cache (plan.cpu_kv_space) and render gives the engine that one."""
    raw = env.get("VLLM_CPU_KVCACHE_SPACE", "")
    if raw == "":  # vLLM 0.32's CPU platform ignores it empty (platforms/cpu.py)
        return None
    try:
        # and reads any other value with int(): "1.5" or "lots" stops the engine at its start
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise PlanError(f"VLLM_CPU_KVCACHE_SPACE={raw.strip()!r}: vLLM's CPU engine reads it as a "
                        "whole number of GiB for its KV cache (e.g. 4); set one, or unset it to "
                        "let the plan size the cache")
    return float(value)


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """What shapes the engine command beyond the plan; `plan` takes them too, so that it prints
    the command `serve` runs for the same options."""
    p.add_argument("--served-model-name", type=argtypes.name,
                   help="name clients use (default: the model's)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let vLLM run code shipped with the model (off unless asked)")
    p.add_argument("--ray-address", type=argtypes.host_port,
                   help="run vLLM on an existing Ray cluster (HEAD:PORT; GPU nodes only)")
    p.add_argument("--node-rank", type=argtypes.whole,
                   help="with --nodes and --master-addr: this node's place, 0 on the head (it "
                   "runs the proxy), 1.. on the others (their share of vLLM, headless)")
    p.add_argument("--master-addr", type=argtypes.nonempty,
                   help="the head's address on the network between the nodes (vLLM's own "
                   "multi-node executor, no Ray)")
    p.add_argument("--master-port", type=argtypes.port, default=DEFAULT_MASTER_PORT,
                   help=f"vLLM's port on the head (default {DEFAULT_MASTER_PORT}); toposerve's "
                   "node link uses the next one")
    p.add_argument("--allow-internal-media", action="store_true",
                   help="serve: the proxy relays media URLs pointing at this machine or a "
                   "private network, and vLLM fetches media from any host and follows "
                   "redirects (default: refused)")
    p.add_argument("--allowed-media-domains", type=argtypes.nonempty, metavar="HOSTS",
                   help="exact host names (comma-separated) vLLM may fetch media URLs from "
                   "(default: none; data: URLs still work)")
    p.add_argument("extra", nargs=argparse.REMAINDER,
                   help="after --: extra arguments passed to vLLM as they are, last")


def node_place(args: argparse.Namespace) -> NodePlace | None:
    """This node's place in a group under vLLM's own multi-node executor, or None on one
    machine (or on Ray). One line for options that do not make a group."""
    # `tune` builds its namespaces without these options: it serves on one machine
    rank, addr = getattr(args, "node_rank", None), getattr(args, "master_addr", None)
    nodes, port = args.nodes, getattr(args, "master_port", DEFAULT_MASTER_PORT)
    if addr is None:
        if rank is not None:
            raise LauncherError(f"--node-rank {rank} needs --master-addr HEAD (the head's "
                                "address) and --nodes N")
        return None
    if getattr(args, "ray_address", None):
        raise LauncherError("--master-addr (vLLM's own multi-node executor) and --ray-address "
                            "(vLLM on Ray) are two ways to span nodes: pass one")
    if nodes < 2:
        raise LauncherError(f"--master-addr {addr} is for a group of nodes: pass --nodes N "
                            "(2 or more) and --node-rank R on each")
    rank = 0 if rank is None else rank
    if rank >= nodes:
        raise LauncherError(f"--node-rank {rank} with --nodes {nodes}: the head is 0, the other "
                            f"nodes 1..{nodes - 1}")
    if port >= 65535:
        raise LauncherError(f"--master-port {port}: the node link needs the next port too; "
                            "pass one below 65535")
    return NodePlace(nodes, rank, addr, port)


def given_options(args: argparse.Namespace, *, master_addr: str) -> list[str]:
    """The planning and engine options ``args`` holds that differ from their defaults, as
    words `launcher serve` takes (without --node-rank and the extra vLLM flags): so that a
    line printed for each node plans there exactly as here."""
    p = argparse.ArgumentParser(add_help=False)
    add_planning_arguments(p, model_help="")
    add_engine_arguments(p)
    words: list[str] = []
    for action in p._actions:  # argparse keeps no public list of them
        if not action.option_strings or action.dest == "node_rank":
            continue
        value = master_addr if action.dest == "master_addr" else getattr(args, action.dest, None)
        if value is None or (value == action.default and action.dest != "master_port"):
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            words.append(flag)
        else:
            words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return words


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
