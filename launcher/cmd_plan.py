"""`launcher plan`: choose TP/PP/replicas for a model on this machine (or a saved topology)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
from typing import Any

from launcher import hardware
from launcher.modelspec import load_model_spec
from launcher.plan import WORKLOADS, Candidate, Plan, Policy, plan
from launcher.render import Rendered, plan_to_json, render
from launcher.topology import load_topology


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    """The planning options, shared with the commands that plan before they act."""
    p.add_argument(
        "--model", required=True, help="local model folder or Hugging Face id (read offline)"
    )
    p.add_argument(
        "--topology",
        metavar="FILE",
        help="saved topology (probe --save, or an NVML dump) instead of NVML",
    )
    p.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="interactive",
        help="interactive: one agent, latency first (default); throughput: many streams",
    )
    p.add_argument(
        "--concurrency", type=int, help="streams to expect (default 1 interactive, 32 throughput)"
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        help="context length to guarantee (default: the longest that fits)",
    )
    p.add_argument(
        "--prompt", type=int, default=512, help="prompt tokens of a typical request (default 512)"
    )
    p.add_argument(
        "--gen", type=int, default=256, help="generated tokens of a typical request (default 256)"
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--tp", type=int, help="force the tensor-parallel size")
    p.add_argument("--pp", type=int, help="force the pipeline-parallel size")
    p.add_argument("--dp", type=int, help="force the number of data-parallel replicas")
    p.add_argument("--nodes", type=int, default=1, help="plan for this many identical nodes (Ray)")
    p.add_argument(
        "--gpus-per-node", type=int, help="GPUs used on each node (default: all of the topology)"
    )
    p.add_argument(
        "--network-gbps",
        type=float,
        default=100.0,
        help="link between nodes in Gbit/s (default 100: 100G Ethernet/RoCE)",
    )


def policy_from_args(args: argparse.Namespace) -> Policy:
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
    )


def make_plan(args: argparse.Namespace) -> Plan:
    topo = load_topology(args.topology, os.environ)
    return plan(topo, load_model_spec(args.model), policy_from_args(args))


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan", help="choose tensor/pipeline parallel and replicas, and explain why"
    )
    add_policy_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="host in the rendered vllm command")
    p.add_argument("--port", type=int, default=8000, help="port in the rendered vllm command")
    p.add_argument("--served-model-name", help="name clients use (vllm --served-model-name)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    chosen = make_plan(args)
    rendered = render(
        chosen, args.model, served_name=args.served_model_name, host=args.host, port=args.port
    )
    if args.json:
        print(json.dumps(plan_to_json(chosen, rendered), indent=1))
    else:
        print(format_plan(chosen, rendered))
    return 0


def _cand_row(c: Candidate, chosen: Plan) -> str:
    mark = (
        "*" if (c.tp, c.pp, c.dp, c.gpus) == (chosen.tp, chosen.pp, chosen.dp, chosen.gpus) else " "
    )
    shape = f"{c.mode:<6} tp={c.tp} pp={c.pp} dp={c.dp}"
    gpus = ",".join(map(str, c.gpus)) or "-"
    if c.predicted is None or c.scores is None:
        return f" {mark} {shape:<22} {gpus:<16} rejected: {c.rejected}"
    p = c.predicted
    return (
        f" {mark} {shape:<22} {gpus:<16} {c.transport:<9} {p.prefill_tok_s:>8.0f} "
        f"{p.decode_tok_s:>7.1f} "
        f"{p.throughput_tok_s:>8.0f}   {c.scores.interactive:>5.2f} {c.scores.throughput:>5.2f}"
    )


def format_plan(chosen: Plan, rendered: Rendered) -> str:
    p = chosen.predicted
    lines = [
        f"plan: {chosen.mode} (tp={chosen.tp} pp={chosen.pp} dp={chosen.dp}) on "
        + (
            f"GPU {','.join(map(str, chosen.gpus))} over {chosen.transport}"
            if chosen.engine == "gpu"
            else "the CPU engine"
        ),
        f"predicted: prefill {p.prefill_tok_s:.0f} tok/s (512-token prompt), "
        f"decode {p.decode_tok_s:.1f} tok/s (one stream), "
        f"{p.throughput_tok_s:.0f} tok/s aggregate; "
        f"max_model_len {chosen.max_model_len}",
        "",
        "why:",
        *(f"  - {r}" for r in chosen.reasons),
        "",
        "candidates (tok/s; scores: 1.00 = the best for interactive, for throughput):",
        f"   {'shape':<22} {'gpus':<16} {'link':<9} {'prefill':>8} {'decode':>7} {'aggr':>8}   "
        f"{'inter':>5} {'thru':>5}",
        *(_cand_row(c, chosen) for c in chosen.candidates),
        "",
        "command:",
        "  "
        + " ".join(f"{k}={shlex.quote(v)}" for k, v in rendered.env.items())
        + (" " if rendered.env else "")
        + shlex.join(rendered.argv),
    ]
    lines += [f"note: {n}" for n in rendered.notes]
    return "\n".join(lines)
