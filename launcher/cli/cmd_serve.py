"""`launcher serve`: the main job. Plans like `launcher plan`, then starts and supervises."""

from __future__ import annotations

import argparse
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from launcher.cli import agentopts, argtypes, planopts
from launcher.engine import supervise
from launcher.engine.enginecmd import NodePlace
from launcher.engine.extras import EngineExtras, media_protection
from launcher.engine.launchspec import LaunchSpec, replica_specs
from launcher.engine.serve import Supervision, run
from launcher.errors import LauncherError, ModelError, PlanError
from launcher.model import tinymodel
from launcher.planner.agent import AgentPlan


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
    p.add_argument("--api-key-file", type=Path, help="file with one key per line (mode 600)")
    p.add_argument("--plan", type=Path, help="use a plan saved by `launcher plan --json` or "
                   "`launcher tune` instead of planning")
    p.add_argument("--ready-timeout", type=argtypes.positive, default=900.0,
                   help="seconds to wait for vLLM")
    p.add_argument("--restart-attempts", type=argtypes.whole, default=5)
    p.add_argument("--grace", type=argtypes.seconds, default=30.0,
                   help="seconds to drain on shutdown")
    p.add_argument("--join-timeout", type=argtypes.positive, default=120.0,
                   help="a node other than the head (--node-rank 1..): seconds to look for the "
                   "head before giving up (default 120)")
    p.add_argument("--node-secret-file", type=Path, metavar="PATH",
                   help="a group of nodes: the file with the node link's shared secret (else "
                   "TOPOSERVE_NODE_SECRET, else ~/.cache/toposerve/node-secret; the head writes "
                   "a new one there when there is none)")
    p.add_argument("--log-dir", type=Path, help="where vLLM and proxy logs go")
    add_protection_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="print the plan and commands only")
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


def engine_extras(args: argparse.Namespace) -> EngineExtras:
    from launcher.engine.vllmflags import installed_engine_flags

    domains = [d.strip() for d in (getattr(args, "allowed_media_domains", None) or "").split(",")
               if d.strip()]
    media = media_protection(domains, allow_internal=getattr(args, "allow_internal_media", False))
    return replace(media, known=installed_engine_flags())


ENGINE_KEY_ENV = "TOPOSERVE_ENGINE_API_KEY"


def engine_key(env: Mapping[str, str], extra: Sequence[str] = ()) -> str:
    """vLLM's key for this run: the user's own `-- --api-key K` (vLLM takes it over
    VLLM_API_KEY, so the proxy must send that one), else TOPOSERVE_ENGINE_API_KEY where the user
    wants to reach the engine directly too (loadgen against the engine's port), else a new
    random one."""
    return (planopts.last_value(extra, "--api-key") or env.get(ENGINE_KEY_ENV, "").strip()
            or secrets.token_urlsafe(32))


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
    spec = build_spec(args, keys)
    for line in spec.summary:
        console.print(line)
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
        return run(spec, sup, console)
    from launcher.engine import nodes

    return nodes.run_group(spec, sup, console)


def collect_api_keys(flags: Sequence[str], path: Path | None,
                     env: Mapping[str, str]) -> tuple[str, ...]:
    keys = [k for k in flags if k]
    keys += [k.strip() for k in env.get("TOPOSERVE_API_KEYS", "").split(",") if k.strip()]
    if path is not None:
        keys += read_key_file(path)
    return tuple(dict.fromkeys(keys))


def read_key_file(path: Path) -> list[str]:
    """The file's keys, read exactly as the proxy reads them (topocommon.keyfile)."""
    from topocommon import keyfile

    try:
        return keyfile.read_key_file(path)
    except keyfile.KeyFileError as exc:
        raise LauncherError(str(exc)) from None


def resolve_model(ref: str | None) -> tuple[str, str]:
    """(model reference for vLLM, served name). None means the embedded tiny model."""
    if ref is None:
        return str(tinymodel.ensure_tiny_model()), tinymodel.SERVED_NAME
    path = Path(ref).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} has no config.json: pass the directory that holds the "
                             "model's config.json and weights")
        return str(path.resolve()), path.resolve().name
    if ref.startswith((".", "/", "~")) or ref.count("/") != 1:
        raise ModelError(f"model path {ref} does not exist: check the path, or pass a Hugging "
                         "Face id such as meta-llama/Llama-3.3-70B-Instruct")
    return ref, ref


def build_spec(args: argparse.Namespace, keys: tuple[str, ...]) -> LaunchSpec:
    # Imported here so that `launcher serve --help` stays fast and NVML is touched only when used.
    from launcher.engine.planfile import plan_from_json
    from launcher.engine.render import render
    from launcher.model.modelspec import load_model_spec
    from launcher.model.toolcalls import chat_template, tokenizer_tokens
    from launcher.probe.topology import load_topology

    model_ref, default_name = resolve_model(args.model)
    served = args.served_model_name or default_name
    model = load_model_spec(model_ref, revision=getattr(args, "revision", None))
    extra = planopts.extra_args(args)
    plan_notes: tuple[str, ...] = ()
    agent: AgentPlan | None = None
    if args.plan is not None:
        saved = read_plan_file(args.plan)
        chosen = plan_from_json(saved)
        # A tuned plan carries the engine flags that won; flags given now come after and win.
        extra = (*saved.get("vllm_extra_args", []), *extra)
        elsewhere = plan_not_for_here(chosen, load_topology(args.topology, os.environ),
                                      args.plan)
        if elsewhere and not args.dry_run:
            raise LauncherError(elsewhere)
        plan_notes = (elsewhere,) if elsewhere else ()
    else:
        try:
            ask = agentopts.agent_ask(args)
            chosen, agent = agentopts.plan_with_agent(
                load_topology(args.topology, os.environ), model, planopts.policy_from_args(args),
                ask, agentopts.free_memory(os.environ) if ask else None)
        except PlanError as exc:
            if args.ray_address and args.nodes == 1 and (args.pp or 1) > 1:
                # The topology is this node's: stages meant for the other nodes must be said.
                raise PlanError(f"{exc}; on a Ray cluster say how many nodes the stages go to "
                                f"with --nodes (e.g. --nodes {args.pp})") from exc
            raise
    place = planopts.node_place(args)
    check_engine_group(chosen, place, args.ray_address)
    engine_port = args.engine_port or supervise.free_port(args.engine_host, "--engine-host")
    rendered = render(chosen, model_ref, served_name=served, host=args.engine_host,
                      port=engine_port, extra_args=extra,
                      trust_remote_code=args.trust_remote_code, ray_address=args.ray_address,
                      user_env=os.environ, cpu_ids=planopts.cpu_ids(),
                      revision=getattr(args, "revision", None),
                      tokenizer_tokens=tokenizer_tokens(model.path),
                      chat_template=chat_template(model.path),
                      custom_code=model.custom_code, place=place,
                      extras=engine_extras(args) + agentopts.agent_extras(agent, None))
    replicas = replica_specs(rendered.engines, supervise.reachable_host)
    headless = place is not None and place.headless
    return LaunchSpec(
        model_ref=model_ref, served_name=served, host=args.host, port=args.port,
        api_keys=keys, replicas=replicas, plan_info=plan_labels(chosen, served),
        summary=summary_lines(chosen, replicas, model_ref, (*plan_notes, *rendered.notes)),
        # A new key every run: only this run's proxy knows it, so a web page that finds
        # vLLM's loopback port cannot drive it. A headless node serves no API.
        engine_api_key=None if headless else engine_key(os.environ, extra),
        proxy_args=proxy_options(args),
    )


def check_engine_group(chosen: Any, place: NodePlace | None, ray_address: str | None) -> None:
    """One line, before anything starts, for a split the chosen way of spanning nodes cannot
    run: Ray on the CPU build, or layer stages that do not divide over the nodes."""
    if ray_address and chosen.engine == "cpu":
        raise LauncherError(
            "vLLM's CPU build cannot run on a Ray cluster (its CPU platform has no Ray device): "
            "drop --ray-address and use vLLM's own multi-node executor, `launcher serve --nodes "
            "N --node-rank R --master-addr HEAD` on every node (docs/deploy.md)")
    if place is not None and (chosen.dp != 1 or chosen.pp % place.nodes):
        raise LauncherError(
            f"the plan (TP={chosen.tp} PP={chosen.pp} DP={chosen.dp}) does not split into "
            f"{place.nodes} equal shares of layer stages: pass --pp as a multiple of --nodes "
            "(the default is one stage per node) and no --dp")


def plan_not_for_here(chosen: Any, topo: Any, path: Path) -> str | None:
    """Why a saved plan cannot run on this machine (GPUs it names that NVML does not show),
    or None. A plan for several nodes names one node's GPUs and is not checked here."""
    if chosen.engine != "gpu" or getattr(chosen, "nodes", 1) > 1:
        return None
    here = sorted(g.index for g in topo.gpus)
    missing = [g for g in chosen.gpus if g not in here]
    if not missing:
        return None
    have = f"GPU {', '.join(map(str, here))}" if here else "no GPU NVML can read"
    return (f"the plan {path} runs on GPU {', '.join(map(str, chosen.gpus))}, and this machine "
            f"has {have}: plan here (`launcher plan --json > FILE`, or `launcher tune`) or "
            "serve without --plan")


def read_plan_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise LauncherError(f"cannot read the plan file {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise LauncherError(
            f"the plan file {path} is not JSON ({exc.msg} at line {exc.lineno}): "
            "write it with `launcher plan --json > FILE` or `launcher tune`"
        ) from exc
    if not isinstance(data, dict):
        raise LauncherError(f"the plan file {path} does not hold a plan object")
    return data


def plan_labels(chosen: Any, served: str) -> dict[str, str]:
    return {
        "mode": str(chosen.mode), "tp": str(chosen.tp), "pp": str(chosen.pp),
        "dp": str(chosen.dp), "engine": str(chosen.engine),
        "transport": str(getattr(chosen, "transport", "none")), "model": served,
        "gpus": ",".join(str(g) for g in chosen.gpus) or "cpu",
    }


def summary_lines(chosen: Any, replicas: Sequence[Any], model_ref: str,
                  notes: Sequence[str] = ()) -> tuple[str, ...]:
    lines = [f"[bold]Plan:[/] {chosen.mode} (tp={chosen.tp} pp={chosen.pp} dp={chosen.dp}, "
             f"engine {chosen.engine}) for {model_ref}"]
    lines += [f"  • {reason}" for reason in chosen.reasons]
    pred = getattr(chosen, "predicted", None)
    if pred is not None and chosen.engine != "cpu":
        lines.append(f"  predicted: prefill {pred.prefill_tok_s:,.0f} tok/s, decode "
                     f"{pred.decode_tok_s:,.1f} tok/s single stream, throughput "
                     f"{pred.throughput_tok_s:,.0f} tok/s")
    for r in replicas:
        lines.append(f"  engine: {r.command.shell_line()}")
    place = replicas[0].command.place if replicas else None
    if place is not None and place.headless:
        lines.append(f"  node {place.rank} of {place.nodes}: this node's share of the layers, "
                     f"headless; the head at {place.master_addr} runs the proxy")
    else:
        lines.append("  proxy upstreams: " + " ".join(r.url for r in replicas))
    lines += [f"  note: {escape(n)}" for n in notes]  # a note quotes tokens like [TOOL_CALLS]
    return tuple(lines)

