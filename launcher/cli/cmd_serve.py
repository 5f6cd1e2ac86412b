"""`launcher serve`: the main job. Plans like `launcher plan`, then starts and supervises."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from launcher.cli import argtypes, planopts
from launcher.cli.apikeys import collect_api_keys
from launcher.engine import supervise
from launcher.engine.launchspec import LaunchSpec
from launcher.engine.serve import Cutting, Supervision, run
from launcher.errors import LauncherError
from launcher.model import tinymodel
from launcher.pipeline.requests import ServeRequest

if TYPE_CHECKING:
    from launcher.pipeline.run import Planned


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="plan, start vLLM and the proxy, and keep them running",
        description="Serve a model behind the toposerve proxy. Without --model, serves the "
        "embedded tiny model (generated locally on first use) on the CPU engine.",
    )
    planopts.add_planning_arguments(
        p, model_help="local model directory or Hugging Face id (in the local cache); "
        "default: the embedded tiny model")
    planopts.add_engine_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address the proxy binds (default "
                   "127.0.0.1; anything else exposes the API to the network)")
    p.add_argument("--port", type=argtypes.port, default=8000, help="proxy port (default 8000)")
    p.add_argument("--engine-port", type=argtypes.port,
                   help="first internal vLLM port (default: free)")
    p.add_argument("--engine-host", default="127.0.0.1", help="address vLLM binds (default "
                   "127.0.0.1: only the proxy reaches it; 0.0.0.0 lets a Prometheus in the "
                   "same network scrape vLLM's own metrics, and anyone there reach it without "
                   "the proxy's keys)")
    p.add_argument("--api-key", action="append", default=[], help="require this key (repeat "
                   "for several); also TOPOSERVE_API_KEYS=k1,k2")
    p.add_argument("--api-key-file", type=argtypes.path,
                   help="file with one key per line (mode 600)")
    p.add_argument("--plan", type=argtypes.path, help="use a plan saved by `launcher plan "
                   "--json` or `launcher tune` instead of planning")
    p.add_argument("--ready-timeout", type=argtypes.positive, default=900.0,
                   help="seconds to wait for vLLM (default 900)")
    p.add_argument("--restart-attempts", type=argtypes.whole, default=5,
                   help="times a failed engine is started again before serve gives up "
                   "(default 5; given back after 5 minutes up)")
    p.add_argument("--grace", type=argtypes.seconds, default=30.0,
                   help="seconds to drain on shutdown (default 30)")
    p.add_argument("--join-timeout", type=argtypes.positive, default=120.0,
                   help="a node other than the head (--node-rank 1..): seconds to look for the "
                   "head before giving up (default 120)")
    p.add_argument("--node-secret-file", type=argtypes.path, metavar="PATH",
                   help="a group of nodes: the file with the node link's shared secret (else "
                   "TOPOSERVE_NODE_SECRET, else ~/.cache/toposerve/node-secret; the head writes "
                   "a new one there when there is none)")
    p.add_argument("--log-dir", type=argtypes.path, help="where vLLM and proxy logs go "
                   "(default: logs/ in toposerve's cache)")
    add_protection_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="print the plan and commands only")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="the embedded model on the CPU engine: do not time the engine once it "
                   "is up (done once per machine where no timing is kept, 10-35 s, before the "
                   "proxy takes requests; `launcher probe --measure` does the same)")
    p.set_defaults(func=main)


def add_protection_arguments(p: argparse.ArgumentParser) -> None:
    """The proxy's local-serving protections (server/guard.py, server/conncap.py), passed on to
    it. (The engine's side of the media check, --allowed-media-domains and
    --allow-internal-media, is among the engine arguments, which plan takes too.)"""
    p.add_argument("--allowed-hosts", action="append", default=[], metavar="NAMES",
                   help="proxy: Host names (comma-separated, repeatable) accepted besides "
                   "loopback ones and --host; '*' turns the check off")
    p.add_argument("--allowed-origins", action="append", default=[], metavar="ORIGINS",
                   help="proxy: web origins (scheme://host[:port]) a proxy without keys takes "
                   "requests from besides its own and loopback ones; '*' turns the check off")
    p.add_argument("--max-connections", type=argtypes.count, metavar="N",
                   help="proxy: open client connections at most (default: half the "
                   "descriptor limit)")


def proxy_options(args: argparse.Namespace) -> tuple[str, ...]:
    """serve's protection options as the proxy's own words (`tune` has none of them)."""
    words: list[str] = []
    for flag, dest in (("--allowed-hosts", "allowed_hosts"),
                       ("--allowed-origins", "allowed_origins")):
        for value in getattr(args, dest, None) or []:
            words += [flag, value]
    if getattr(args, "allow_internal_media", False):
        words.append("--allow-internal-media")
    if getattr(args, "max_connections", None) is not None:
        words += ["--max-connections", str(args.max_connections)]
    return tuple(words)


def main(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True)
    place = planopts.node_place(args)
    headless = place is not None and place.headless
    if not headless:  # a node other than the head runs no proxy: its port is not used
        supervise.check_port_free(args.host, args.port)
    keys = () if headless else collect_api_keys(args.api_key, args.api_key_file, os.environ)
    if not headless and args.host not in ("127.0.0.1", "localhost", "::1") and not keys:
        console.print(f"[bold red]WARNING:[/] binding to {args.host} without an API key: anyone "
                      "who can reach this machine can use the model. Pass --api-key.")
    planned, spec = planned_spec(args, keys)
    for line in spec.summary:
        console.print(line)
    from launcher.pipeline import enginesteps

    step = first_serve_step(args, planned, spec)
    if step == enginesteps.HINT:
        console.print(f"  note: {enginesteps.HINT_LINE}", markup=False)
    if args.dry_run:
        return 0
    log_dir = args.log_dir or tinymodel.default_cache_dir(os.environ) / "logs"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(log_dir, os.W_OK):
            raise PermissionError(13, "not writable")
    except OSError as exc:
        raise LauncherError(f"cannot write logs to {log_dir} ({exc.strerror or exc}): pass "
                            "--log-dir with a folder you can write") from exc
    sup = Supervision(ready_timeout_s=args.ready_timeout, restart_attempts=args.restart_attempts,
                      grace_s=args.grace, log_dir=log_dir, join_timeout_s=args.join_timeout,
                      node_secret_file=args.node_secret_file)
    if place is None:
        timing = (calibration(planned, spec, console) if step == enginesteps.TIME else None)
        return run(spec, sup, console, after_ready=timing)
    from launcher.engine import nodes

    return nodes.run_group(spec, sup, console)


def serve_request(args: argparse.Namespace, keys: tuple[str, ...]) -> ServeRequest:
    """serve's options, typed: the plan (or the saved one), its engine, the proxy before it."""
    engine = planopts.engine_request(args, host=args.engine_host, port=args.engine_port)
    plan = replace(planopts.plan_request(args, engine), saved_plan=args.plan,
                   # --dry-run shows a saved plan made elsewhere, with a note, instead of refusing
                   refuse_elsewhere=not args.dry_run)
    return ServeRequest(plan, host=args.host, port=args.port, api_keys=keys,
                        proxy_args=proxy_options(args))


def build_spec(args: argparse.Namespace, keys: tuple[str, ...]) -> LaunchSpec:
    return planned_spec(args, keys)[1]


def planned_spec(args: argparse.Namespace, keys: tuple[str, ...]) -> tuple[Planned, LaunchSpec]:
    # Imported here so that `launcher serve --help` stays fast and NVML is touched only when used.
    from launcher.pipeline.run import launch_spec, plan_and_render

    request = serve_request(args, keys)
    planned = plan_and_render(request.plan, os.environ)
    return planned, launch_spec(planned, request)


def first_serve_step(args: argparse.Namespace, planned: Planned, spec: LaunchSpec) -> str | None:
    """Whether this serve times the CPU engine it starts (enginesteps.first_serve)."""
    from launcher.pipeline import enginesteps

    chosen, request = planned.plan, planned.request
    return enginesteps.first_serve(
        os.environ, engine=str(chosen.engine),
        single=(chosen.tp, chosen.pp, chosen.dp) == (1, 1, 1) and len(spec.replicas) == 1,
        # the embedded model as `probe --measure` serves it: vLLM flags or a context of the
        # user's own would time (and keep for every later plan) another engine than that
        default_model=(request.model is None and not request.engine.extra_args
                       and request.policy.max_model_len is None),
        planned_here=(request.saved_plan is None and request.topology is None
                      and request.engine.place is None),
        calibrate=args.calibrate)


def calibration(planned: Planned, spec: LaunchSpec,
                console: Console) -> Callable[[Cutting], None]:
    """What serve runs once its engine is ready, before the proxy: time that engine, keep the
    record, plan the same request again with it and print both plans' figures."""
    from launcher.pipeline import enginesteps
    from launcher.pipeline.run import plan_and_render
    from launcher.probe import enginestep

    key = spec.engine_api_key
    served = enginestep.Served(spec.replicas[0].url, spec.served_name,
                               {"Authorization": f"Bearer {key}"} if key else {})

    def timing(cut: Cutting) -> None:
        console.print("  timing this machine's CPU engine once (10-35 s; kept for later plans; "
                      "--no-calibrate skips it)…", markup=False)
        done = enginesteps.calibrate_served(
            os.environ, served, planned.plan.predicted,
            lambda: plan_and_render(planned.request, os.environ).plan.predicted, cut=cut)
        console.print(f"{'[green]✓[/]' if done.ok else '[yellow]![/]'} {escape(done.line)}")

    return timing
