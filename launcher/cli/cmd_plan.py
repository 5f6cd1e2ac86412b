"""`launcher plan`: choose TP/PP/replicas for a model on this machine (or a saved topology)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
from dataclasses import replace
from typing import Any

from launcher.cli import argtypes, planopts
from launcher.engine import nodesecret
from launcher.engine.enginecmd import NodePlace
from launcher.engine.render import Rendered
from launcher.pipeline.run import Planned, plan_and_render, plan_file, render_at
from launcher.planner.costmodel import Prediction
from launcher.planner.loadsim import SimulatedPrediction
from launcher.planner.plan import Candidate, Plan


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan", help="choose tensor/pipeline parallel and replicas, and explain why"
    )
    planopts.add_planning_arguments(
        p,
        model_help="local model folder, or Hugging Face id (org/name: config fetched)",
        model_required=True,
    )
    planopts.add_engine_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address vLLM binds in the command")
    p.add_argument("--port", type=argtypes.port, default=8000,
                   help="vLLM's (first) port in the command")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    engine = planopts.engine_request(args, host=args.host, port=args.port)
    # the one way serve and tune take too: what is printed here is what serve runs
    planned = plan_and_render(planopts.plan_request(args, engine), os.environ)
    nodes = node_commands(args, planned)
    if args.json:
        out = plan_file(planned)  # what `serve --plan` reads back
        if nodes:
            out["node_commands"] = [
                {"node_rank": r, "serve": serve, "argv": list(e.argv), "env": e.env}
                for r, (serve, e) in enumerate(nodes)
            ]
        print(json.dumps(out, indent=1))
    else:
        print(format_plan(planned.plan, planned.rendered, prompt=args.prompt))
        if nodes:
            print(format_nodes(nodes, given=engine.place is not None))
    return 0


PLACEHOLDER_HEAD = "HEAD"


def node_commands(args: argparse.Namespace, planned: Planned) -> list[tuple[list[str], Rendered]]:
    """Per node of a group on vLLM's own executor: the `launcher serve` line a user types there
    (these options, its own --node-rank) and the vLLM command it runs. None on Ray or one node."""
    if args.nodes < 2 or args.ray_address:
        return []
    base = (planned.request.engine.place
            or NodePlace(args.nodes, 0, PLACEHOLDER_HEAD, args.master_port))
    options = planopts.given_options(args, master_addr=base.master_addr)
    extra = list(planopts.extra_args(args))
    return [(["launcher", "serve", *options, "--node-rank", str(r), *(["--", *extra] if extra
                                                                      else [])],
             render_at(planned, replace(base, rank=r)))
            for r in range(args.nodes)]


def format_nodes(nodes: list[tuple[list[str], Rendered]], *, given: bool) -> str:
    lines = ["", "on each node (the same options, its own --node-rank; node 0 is the head and "
             "runs the proxy):"]
    for rank, (serve, rendered) in enumerate(nodes):
        role = " (head)" if rank == 0 else ""
        lines.append(f"  node {rank}{role}: {shlex.join(serve)}")
        lines.append(f"    vLLM there: {rendered.engines[0].shell_line()}")
    if not given:
        lines.append(f"note: replace {PLACEHOLDER_HEAD} with the head's address on the network "
                     "between the nodes (or pass --master-addr to this command)")
    lines.append("note: the nodes prove a shared secret to each other: node 0 writes one on its "
                 f"first start (to <cache>/{nodesecret.DEFAULT_NAME}, or --node-secret-file "
                 f"PATH, or {nodesecret.SECRET_ENV}); give every other node the same before "
                 "starting it")
    return "\n".join(lines)


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


def _load_line(p: Prediction) -> list[str]:
    if not isinstance(p, SimulatedPrediction):
        return []
    return [f"under load ({p.load_concurrency} streams, simulated scheduler): TTFT p50 "
            f"{p.ttft_p50_s * 1e3:.0f} ms, p90 {p.ttft_p90_s * 1e3:.0f} ms; TPOT p50 "
            f"{p.tpot_p50_s * 1e3:.1f} ms; {p.sim_throughput_tok_s:.0f} tok/s aggregate "
            "simulated"]


def format_plan(chosen: Plan, rendered: Rendered, prompt: int = 512) -> str:
    p = chosen.predicted
    lines = [
        f"plan: {chosen.mode} (tp={chosen.tp} pp={chosen.pp} dp={chosen.dp}) on "
        + (
            f"GPU {','.join(map(str, chosen.gpus))} over {chosen.transport}"
            if chosen.engine == "gpu"
            else "the CPU engine"
        ),
        f"predicted: prefill {p.prefill_tok_s:.0f} tok/s ({prompt}-token prompt), "
        f"decode {p.decode_tok_s:.1f} tok/s (one stream), "
        f"{p.throughput_tok_s:.0f} tok/s aggregate; "
        f"max_model_len {chosen.max_model_len}",
        *_load_line(p),
        "",
        "why:",
        *(f"  - {r}" for r in chosen.reasons),
        "",
        "candidates (tok/s; scores: 1.00 = the best for interactive, for throughput):",
        f"   {'shape':<22} {'gpus':<16} {'link':<9} {'prefill':>8} {'decode':>7} {'aggr':>8}   "
        f"{'inter':>5} {'thru':>5}",
        *(_cand_row(c, chosen) for c in chosen.candidates),
        "",
        "command:" if len(rendered.engines) == 1 else "commands (one per replica):",
        *(f"  {e.shell_line()}" for e in rendered.engines),
    ]
    lines += [f"note: {n}" for n in rendered.notes]
    return "\n".join(lines)
