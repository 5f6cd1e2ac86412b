"""`launcher tune`: start each candidate plan in turn, measure it with loadgen, keep the best.

Each candidate runs exactly as `launcher serve` would run it (same plan, same proxy), and loadgen
measures it through the proxy with the same CLI a user runs, so the comparison is the real thing.
The winner is written as a plan file that `launcher serve --plan FILE` uses.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from launcher import planopts, tinymodel
from launcher.cmd_serve import build_spec, collect_api_keys
from launcher.errors import LauncherError
from launcher.launchspec import LaunchSpec
from launcher.serve import Runner, StopRequested, Supervision
from launcher.tune import CandidateSpec, Measured, parse_candidate, score, winner

CPU_DEFAULT_CANDIDATES = (
    "name=default",
    "name=small-prefill-chunks --max-num-batched-tokens 256",
)


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "tune", help="A/B the candidate plans with loadgen and keep the best",
        description="Start each candidate plan in turn, measure it through the proxy with "
        "loadgen, print the comparison and write the winner for `launcher serve --plan`.")
    planopts.add_planning_arguments(
        p, model_help="model directory or HF id (default: the embedded model)")
    # tune measures with loadgen at this concurrency too, so it needs a number, not "planner's"
    p.set_defaults(concurrency=16)
    p.add_argument("--candidate", action="append", default=[], metavar="SPEC",
                   help="a candidate: 'tp=2', 'pp=2', 'tp=2 dp=2', or 'name=x --vllm-flag v' "
                   "(use --candidate='...' when SPEC starts with --). Default: the planner's "
                   "best three, or two engine settings on the CPU")
    p.add_argument("--requests", type=int, help="requests per candidate (default 3 "
                   "interactive, 4x concurrency throughput)")
    p.add_argument("--out", type=Path, default=Path("tuned-plan.json"))
    p.add_argument("--results-dir", type=Path, help="keep each candidate's loadgen JSON here")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", action="append", default=[])
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--log-dir", type=Path)
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: flags for every candidate")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True)
    keys = collect_api_keys(args.api_key, None, os.environ)
    specs = [parse_candidate(c) for c in args.candidate] or default_candidates(args)
    results_dir = args.results_dir or Path(tempfile.mkdtemp(prefix="toposerve-tune-"))
    results_dir.mkdir(parents=True, exist_ok=True)
    measured: list[Measured] = []
    chosen_json: dict[str, dict[str, Any]] = {}
    for cand in specs:
        console.rule(f"candidate {cand.name}")
        spec_args = candidate_args(args, cand)
        spec = build_spec(spec_args, keys)
        for line in spec.summary:
            console.print(line)
        chosen_json[cand.name] = plan_json(spec_args)
        measured.append(measure(cand, spec, args, results_dir, console))
    best = winner(measured, args.workload, args.gen)
    console.print(comparison(measured, args.gen, best))
    write_plan(args.out, chosen_json[best.candidate.name], best, measured, args)
    console.print(f"Winner for {args.workload}: [bold]{best.candidate.name}[/]; plan written to "
                  f"{args.out} — serve it with `launcher serve --plan {args.out}`")
    return 0


def default_candidates(args: argparse.Namespace) -> list[CandidateSpec]:
    from launcher.modelspec import load_model_spec
    from launcher.plan import plan
    from launcher.topology import load_topology

    topo = load_topology(args.topology, os.environ)
    if not topo.gpus:
        return [parse_candidate(c) for c in CPU_DEFAULT_CANDIDATES]
    model_ref = args.model or str(tinymodel.ensure_tiny_model())
    chosen = plan(topo, load_model_spec(model_ref, revision=args.revision),
                  planopts.policy_from_args(args))
    viable = [c for c in chosen.candidates if not c.rejected]
    ranked = sorted(viable, key=lambda c: _candidate_score(c, args.workload), reverse=True)
    return [CandidateSpec(f"tp={c.tp} pp={c.pp} dp={c.dp}", c.tp, c.pp, c.dp)
            for c in ranked[:3]]


def _candidate_score(c: Any, workload: str) -> float:
    scores = getattr(c, "scores", None)
    if scores is not None:
        return float(getattr(scores, workload, 0.0) or 0.0)
    pred = c.predicted
    return float(pred.throughput_tok_s if workload == "throughput" else pred.decode_tok_s)


def candidate_args(args: argparse.Namespace, cand: CandidateSpec) -> argparse.Namespace:
    ns = copy.copy(args)
    ns.tp, ns.pp, ns.dp = cand.tp, cand.pp, cand.dp
    ns.extra = [*cand.vllm_args, *[a for a in (args.extra or []) if a != "--"]]
    ns.served_model_name = None
    ns.plan = None
    ns.engine_port = None
    ns.engine_host = "127.0.0.1"  # only the tune's loadgen talks to it, through the proxy
    ns.concurrency = args.concurrency if args.workload == "throughput" else 1
    ns.trust_remote_code = False
    ns.ray_address = None
    return ns


def plan_json(ns: argparse.Namespace) -> dict[str, Any]:
    """The candidate's plan as `launcher plan --json` would print it, plus its vLLM flags."""
    from launcher.cmd_serve import resolve_model
    from launcher.modelspec import load_model_spec
    from launcher.plan import plan
    from launcher.render import plan_to_json, render
    from launcher.topology import load_topology

    model_ref, served = resolve_model(ns.model)
    chosen = plan(load_topology(ns.topology, os.environ),
                  load_model_spec(model_ref, revision=getattr(ns, "revision", None)),
                  planopts.policy_from_args(ns))
    rendered = render(chosen, model_ref, served_name=served, host="127.0.0.1", port=0,
                      extra_args=ns.extra, user_env=os.environ)
    data = plan_to_json(chosen, rendered)
    data["vllm_extra_args"] = list(ns.extra)
    return data


def measure(cand: CandidateSpec, spec: LaunchSpec, args: argparse.Namespace, results: Path,
            console: Console) -> Measured:
    log_dir = args.log_dir or tinymodel.default_cache_dir(os.environ) / "logs"
    runner = Runner(spec, Supervision(ready_timeout_s=args.ready_timeout, restart_attempts=0,
                                      grace_s=10.0, log_dir=log_dir), console)
    out = results / f"{_slug(cand.name)}.json"
    with runner.guard.installed():
        try:
            runner.start()
            code, tail = run_loadgen(spec, args, out)
        except StopRequested:
            raise KeyboardInterrupt from None
        except LauncherError as exc:
            return Measured(cand, False, error=str(exc))
        finally:
            runner.shutdown()
    if code != 0 or not out.exists():
        return Measured(cand, False, error=f"loadgen exited {code}: {tail}")
    return Measured(cand, True, json.loads(out.read_text())["summary"])


def run_loadgen(spec: LaunchSpec, args: argparse.Namespace, out: Path) -> tuple[int, str]:
    conc = args.concurrency if args.workload == "throughput" else 1
    requests = args.requests or (4 * conc if args.workload == "throughput" else 3)
    argv = [sys.executable, "-m", "loadgen", "--url", f"http://{spec.host}:{spec.port}",
            "--prompt", str(args.prompt), "--gen", str(args.gen), "--concurrency", str(conc),
            "--requests", str(requests), "--json", str(out)]
    env = dict(os.environ)
    if spec.api_keys:
        argv += ["--api-key", spec.api_keys[0]]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    return res.returncode, (res.stderr or res.stdout).strip()[-300:]


def comparison(results: Sequence[Measured], gen: int, best: Measured) -> Table:
    table = Table(title="launcher tune: measured through the proxy")
    for col in ("candidate", "TTFT p50 ms", "prefill tok/s", "decode tok/s", "output tok/s",
                "interactive (answers/s)", "throughput (tok/s)", ""):
        table.add_column(col, justify="left" if col == "candidate" else "right")
    for r in results:
        if not r.ok:
            table.add_row(r.candidate.name, "failed", "", "", "", "", "", r.error or "")
            continue
        s = r.summary
        table.add_row(
            r.candidate.name, _fmt(_p50(s, "ttft_s"), 1000), _fmt(_p50(s, "prefill_tok_s")),
            _fmt(_p50(s, "decode_tok_s")), _fmt(s.get("output_tok_s")),
            _fmt(score(s, "interactive", gen), digits=3), _fmt(score(s, "throughput", gen)),
            "← best" if r is best else "")
    return table


def _p50(summary: Any, key: str) -> float | None:
    value = summary.get(key) or {}
    got = value.get("p50") if isinstance(value, dict) else None
    return float(got) if isinstance(got, (int, float)) else None


def _fmt(value: Any, scale: float = 1.0, digits: int = 1) -> str:
    return f"{float(value) * scale:,.{digits}f}" if isinstance(value, (int, float)) else "–"


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[:60] or "candidate"


def write_plan(path: Path, plan_data: dict[str, Any], best: Measured,
               results: Sequence[Measured], args: argparse.Namespace) -> None:
    data = dict(plan_data)
    data["tuned"] = {
        "workload": args.workload, "prompt": args.prompt, "gen": args.gen,
        "winner": best.candidate.name,
        "results": [{"candidate": r.candidate.name, "ok": r.ok, "error": r.error,
                     "score": score(r.summary, args.workload, args.gen),
                     "summary": dict(r.summary)} for r in results],
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
