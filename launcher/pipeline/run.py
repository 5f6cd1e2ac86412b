"""One way from a typed request to the engine: `plan`, `serve` (and its --dry-run and --plan FILE)
and every candidate of `tune` go through :func:`plan_and_render`, so that the command `plan`
prints is the one `serve` runs and the one `tune` measures and writes.

    PlanRequest ─► model (ModelSpec) + topology ─► Plan (planned, or read from a plan file)
                ─► EngineCommand(s) (engine/render) ─► Planned ─► LaunchSpec (serve, tune)
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.markup import escape

from launcher.engine import supervise
from launcher.engine.enginecmd import NodePlace
from launcher.engine.extras import EngineExtras, media_protection
from launcher.engine.launchspec import LaunchSpec, ReplicaSpec, replica_specs
from launcher.engine.planfile import (
    EMBEDDED_MODEL,
    SavedModel,
    agent_to_json,
    model_to_json,
    plan_from_json,
    plan_to_json,
    saved_agent_flags,
    saved_extra_args,
    saved_model,
)
from launcher.engine.render import Rendered, render
from launcher.engine.vllmflags import OptionalFlag, installed_engine_flags, last_value
from launcher.errors import LauncherError, ModelError, PlanError
from launcher.model import tinymodel
from launcher.model.modelspec import ModelSpec, find_config, load_model_spec
from launcher.model.toolcalls import chat_template, lacks_chat_template, tokenizer_tokens
from launcher.pipeline import enginesteps, gpuperfs, hostcosts, kerneltables
from launcher.pipeline.requests import PlanRequest, ServeRequest
from launcher.planner.agent import AgentAsk, AgentPlan, agent_plan, agent_policy
from launcher.planner.kvdtype import checkpoint_kv
from launcher.planner.plan import Plan, plan
from launcher.planner.plantypes import Policy
from launcher.probe.topology import Topology, load_topology
from topocommon import jsontext


@dataclass(frozen=True)
class Chosen:
    """The plan a request gets, before any engine command: planned here, or read from a file."""

    plan: Plan
    agent: AgentPlan | None = None
    # the agent plan's vLLM flags: from the agent plan made now, or the one a plan file saved
    agent_flags: tuple[OptionalFlag, ...] = ()
    saved_extra_args: tuple[str, ...] = ()  # the flags a tuned plan file won with
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Planned:
    """A request planned and rendered: what `plan` prints, `serve` starts, `tune` measures."""

    request: PlanRequest
    chosen: Chosen
    model: ModelSpec
    model_ref: str  # what vLLM is given: an absolute folder, or the hub id
    served_name: str
    port: int  # vLLM's first port
    extra_args: tuple[str, ...]  # the saved plan's vLLM flags, then the user's (which win)
    extras: EngineExtras  # serve's optional flags: the media limits and the agent plan's
    rendered: Rendered
    env: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def plan(self) -> Plan:
        return self.chosen.plan

    @property
    def agent(self) -> AgentPlan | None:
        return self.chosen.agent


def plan_and_render(request: PlanRequest, env: Mapping[str, str]) -> Planned:
    """The plan ``request`` asks for (or the saved one it names) and the engine command(s) that
    run it. ``env``: the launcher's environment (NVML's CUDA_VISIBLE_DEVICES, the cache, the
    user's VLLM_* settings)."""
    saved: dict[str, Any] | None = None
    noted: tuple[str, ...] = ()
    if request.saved_plan is not None:  # read once: the model it names and the plan it holds
        saved = read_plan_file(request.saved_plan)
        request, noted = with_saved_model(request, saved)
    model_ref, default_name = resolve_model(request.model)
    model = load_model_spec(model_ref, revision=request.revision)
    topo = load_topology(request.topology, env)
    chosen = choose(request, model, topo, env, saved)
    chosen = replace(chosen, notes=(*noted, *chosen.notes))
    engine = request.engine
    check_engine_group(chosen.plan, engine.place, engine.ray_address)
    port = engine.port if engine.port is not None else supervise.free_port(engine.host,
                                                                            "--engine-host")
    media = media_protection(engine.media_domains, allow_internal=engine.allow_internal_media)
    # each optional flag kept only where the installed vLLM takes it
    extras = replace(media, known=installed_engine_flags()) + EngineExtras(chosen.agent_flags)
    planned = Planned(request, chosen, model, model_ref, engine.served_name or default_name,
                      port, (*chosen.saved_extra_args, *engine.extra_args), extras,
                      Rendered(()), env)
    return replace(planned, rendered=render_at(planned, engine.place))


def render_at(planned: Planned, place: NodePlace | None) -> Rendered:
    """``planned``'s engine command(s) as the node at ``place`` runs them (its own, or another
    node's of the group, for the lines `plan` prints per node)."""
    engine, model = planned.request.engine, planned.model
    rendered = render(
        planned.plan, planned.model_ref, served_name=planned.served_name, host=engine.host,
        port=planned.port, extra_args=planned.extra_args,
        trust_remote_code=engine.trust_remote_code, ray_address=engine.ray_address,
        user_env=planned.env, cpu_ids=engine.cpu_ids, revision=planned.request.revision,
        tokenizer_tokens=tokenizer_tokens(model.path), chat_template=chat_template(model.path),
        custom_code=model.custom_code, place=place, extras=planned.extras,
        no_chat_template=lacks_chat_template(model.path))
    return replace(rendered, notes=(*planned.chosen.notes, *rendered.notes))


def choose(request: PlanRequest, model: ModelSpec, topo: Topology,
           env: Mapping[str, str], saved: Mapping[str, Any] | None = None) -> Chosen:
    """The saved plan ``request`` names (``saved``: its file, where already read), or a new one
    planned for it."""
    if request.saved_plan is not None:
        data = read_plan_file(request.saved_plan) if saved is None else saved
        return read_saved_plan(data, request.saved_plan, topo,
                               refuse_elsewhere=request.refuse_elsewhere)
    # this model's kernel tables kept on this machine (`probe --measure --model`): plan, serve
    # and tune all plan with them, so that each runs the plan the others show
    tables, unusable = kerneltables.cached(model, topo, env)
    # the KV dtype auto resolves to, before the agent planner sizes its rooms with it
    policy = checkpoint_kv(replace(request.policy, kernels=tables), model)
    topo = replace(topo, notes=(*topo.notes, *unusable))  # kept tables that cannot be used
    topo = enginesteps.attach(topo, env)  # the CPU engine's step, where probe --measure timed it
    if request.host_timing is not None:  # the serving host's, timed there
        topo = replace(topo, host_timing=hostcosts.read(request.host_timing))
    else:  # this host's front end, where probe --measure timed it
        topo = hostcosts.attach(topo, env)
    topo = gpuperfs.attach(topo, env)  # each GPU's GEMM rates, where probe --measure timed it
    try:
        host_free = (request.host_free_bytes if request.host_free_bytes is not None
                     else topo.host_available_bytes)
        chosen, ap = plan_with_agent(topo, model, policy, request.agent, host_free)
    except PlanError as exc:
        if request.engine.ray_address and policy.nodes == 1 and (policy.force_pp or 1) > 1:
            # The topology is this node's: stages meant for the other nodes must be said.
            raise PlanError(f"{exc}; on a Ray cluster say how many nodes the stages go to "
                            f"with --nodes (e.g. --nodes {policy.force_pp})") from exc
        raise
    flags = () if ap is None else tuple(OptionalFlag(f.words, f.why) for f in ap.flags)
    return Chosen(chosen, ap, flags)


def plan_with_agent(topo: Topology, model: ModelSpec, policy: Policy, ask: AgentAsk | None,
                    env_free: int | None) -> tuple[Plan, AgentPlan | None]:
    """The plan, and for an agent workload the agent plan it was made to serve: the layout and
    KV size the agent plan chose, planned again so that the rest of the plan follows them."""
    if ask is None:
        return plan(topo, model, policy), None
    base = plan(topo, model, replace(policy, concurrency=ask.sessions))
    try:
        ap = agent_plan(topo, model, policy, base, ask, env_free)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    final = plan(topo, model, agent_policy(policy, ap))
    # The FP8 KV cache is the agent plan's choice, not a flag of the user's: said once, by it.
    own = "--kv-cache-dtype fp8 (your vLLM flag)"
    kept = tuple(r for r in final.reasons if not (ap.kv_dtype_bytes == 1
                                                   and policy.kv_cache_bytes == 2
                                                   and r.startswith(own)))
    return replace(final, reasons=(*kept, *ap.reasons)), ap


def read_saved_plan(saved: Mapping[str, Any], path: Path, topo: Topology, *,
                    refuse_elsewhere: bool) -> Chosen:
    """A plan file (`launcher plan --json`, `launcher tune`) read from ``path`` as the plan to
    serve: its plan, the vLLM flags a tuned plan won with and the flags of the agent plan it was
    made for."""
    chosen = plan_from_json(saved)
    elsewhere = plan_not_for_here(chosen, topo, path)
    if elsewhere and refuse_elsewhere:
        raise LauncherError(elsewhere)
    return Chosen(chosen, None, saved_agent_flags(saved), saved_extra_args(saved),
                  (elsewhere,) if elsewhere else ())


def plan_file(planned: Planned) -> dict[str, Any]:
    """The plan file `plan --json` prints and `tune` writes: the plan, the command(s) it
    renders, the agent plan it was made for, and the model it was made for (which `serve --plan
    FILE` serves, and checks a --model against)."""
    data = plan_to_json(planned.plan, planned.rendered)
    embedded = planned.request.model is None
    data.update(model_to_json(SavedModel(
        EMBEDDED_MODEL if embedded else planned.model_ref, planned.plan.model,
        planned.request.revision, planned.served_name,
        None if embedded else config_digest(planned.model.path))))
    if planned.agent is not None:
        data["agent"] = agent_to_json(planned.agent)
    return data


def config_digest(folder: str | None) -> str | None:
    """sha256 of the config.json in ``folder`` (what the planner sized the model from), or None
    where there is none to read."""
    try:
        return None if folder is None else hashlib.sha256(
            (Path(folder) / "config.json").read_bytes()).hexdigest()
    except OSError:
        return None


# the embedded model's folder name, which a plan file of an earlier release records as its model
EMBEDDED_NAME = tinymodel.model_dir(Path(), tinymodel.TinyRecipe()).name


def with_saved_model(request: PlanRequest,
                     saved: Mapping[str, Any]) -> tuple[PlanRequest, tuple[str, ...]]:
    """`serve --plan FILE`'s request for the model the file was made for: without --model that
    model (at its revision, under its served name unless one is given); with --model, the same
    model, else refused in one line (a note under --dry-run, as for a plan made for other GPUs).

    The same model: the same folder (however --model reaches it) or hub id and revision; or a
    copy of the folder elsewhere (the same folder name and config.json bytes: a node of a group
    keeps its copy where it likes). A hub id and a local folder are never taken for each other,
    though the folder be a snapshot of it: which revision a folder holds is not checked."""
    path = request.saved_plan
    m = saved_model(saved)
    if m.ref is None:  # a file of an earlier release (or written by hand): the model's name only
        if request.model is None:
            if m.name != EMBEDDED_NAME:
                named = f" (it names {m.name!r})" if m.name else ""
                raise LauncherError(
                    f"the plan {path} does not record which model it was made for{named}: pass "
                    "that model with --model, or make the plan again (`launcher plan --model M "
                    f"--json > {path}`)")
            return request, ()
        given = resolve_model(request.model)[1]
        if m.name and given != m.name:
            return _other_model(request, m.name, request.model, "")  # only names to compare
        return request, ()
    planned = None if m.ref == EMBEDDED_MODEL else m.ref
    if request.model is None and planned is not None and planned.startswith("/") \
            and not Path(planned).exists():
        raise ModelError(
            f"the plan {path} was made for the model at {planned}, which is not on this "
            "machine: pass --model with this machine's copy of it, or make the plan here "
            f"(`launcher plan --model M --json > {path}`)")
    asked = request.model if request.model is not None else planned
    given_ref = resolve_model(asked)[0]  # the one check of a model reference
    if asked is None or (m.ref == EMBEDDED_MODEL
                         and given_ref == str(tinymodel.ensure_tiny_model())):
        given_ref = EMBEDDED_MODEL
    revision = request.revision or m.revision
    if given_ref != m.ref or revision != m.revision:
        if not (given_ref.startswith("/") and m.ref.startswith("/") and revision is None
                and Path(given_ref).name == Path(m.ref).name and m.config_sha256 is not None
                and config_digest(given_ref) == m.config_sha256):
            if request.model is None:  # the plan's own reference reaches another model now
                raise LauncherError(
                    f"the plan {path} was made for {m.ref}, which here is {given_ref}: make the "
                    f"plan here (`launcher plan --model M --json > {path}`)")
            hub_vs_local = given_ref.startswith("/") != m.ref.startswith("/")
            why = (" (a local folder is not taken for a hub model, nor the other way: which "
                   "revision a folder holds is not checked)" if hub_vs_local else "")
            desc = ("the embedded model" if m.ref == EMBEDDED_MODEL
                    else m.ref + (f" at revision {m.revision}" if m.revision else ""))
            given = request.model + (f" --revision {request.revision}" if request.revision
                                     else "")
            return _other_model(request, desc, given, why)
        revision = None  # a copy of the folder: no revision, as the plan had none
    engine = request.engine
    if engine.served_name is None and m.served_name is not None:
        engine = replace(engine, served_name=m.served_name)
    return replace(request, model=asked, revision=revision, engine=engine), ()


def _other_model(request: PlanRequest, planned: str, given: str,
                 why: str) -> tuple[PlanRequest, tuple[str, ...]]:
    """A --model that is not the model the plan file was made for: refused, or the note of a
    dry run."""
    line = (f"the plan {request.saved_plan} was made for {planned}, not --model {given}{why}: "
            f"make a plan for that model (`launcher plan --model {shlex.quote(request.model or '')}"
            f" --json > {request.saved_plan}`) or drop --model to serve the plan's own")
    if request.refuse_elsewhere:
        raise LauncherError(line)
    return request, (line,)


def resolve_model(ref: str | None) -> tuple[str, str]:
    """(model reference for vLLM, served name). None means the embedded tiny model."""
    if ref is None:
        return str(tinymodel.ensure_tiny_model()), tinymodel.SERVED_NAME
    path = Path(ref).expanduser()
    if path.exists():
        # a file (a GGUF, a weights shard) is left to the model reader, which says what it is;
        # so is a folder without config.json (one of GGUF files, say): its reason first
        if path.is_dir() and not (path / "config.json").is_file():
            find_config(str(path), {})
            raise ModelError(f"{path} has no config.json: pass the directory that holds the "
                             "model's config.json and weights")
        resolved = str(path.resolve())
        try:
            resolved.encode("utf-8")
        except UnicodeEncodeError:
            # Python hands vLLM such a name with surrogate escapes, and the Rust tokenizer that
            # transformers loads takes paths as UTF-8 text: vLLM fails at start, however the
            # command is quoted (and the folder's name, served, could not be sent in JSON)
            shown = os.fsencode(resolved).decode("utf-8", "backslashreplace")
            raise ModelError(f"the model folder {shown} is named with bytes that are not UTF-8 "
                             "text: vLLM cannot load a model from it (its tokenizer reads the "
                             "path as UTF-8); rename the folder to a UTF-8 name") from None
        return resolved, path.resolve().name
    if ref.startswith((".", "/", "~")) or ref.count("/") != 1:
        raise ModelError(f"model path {ref} does not exist: check the path, or pass a Hugging "
                         "Face id such as meta-llama/Llama-3.3-70B-Instruct")
    return ref, ref


def check_engine_group(chosen: Plan, place: NodePlace | None, ray_address: str | None) -> None:
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


def plan_not_for_here(chosen: Plan, topo: Topology, path: Path) -> str | None:
    """Why a saved plan cannot run on this machine (GPUs it names that NVML does not show),
    or None. A plan for several nodes names one node's GPUs and is not checked here."""
    if chosen.engine != "gpu" or chosen.nodes > 1:
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
        data = jsontext.loads(path.read_text())
    except OSError as exc:
        raise LauncherError(f"cannot read the plan file {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise LauncherError(
            f"the plan file {path} is not JSON ({exc.msg} at line {exc.lineno}): "
            "write it with `launcher plan --json > FILE` or `launcher tune`"
        ) from exc
    except ValueError as exc:  # not UTF-8 text, or nested past any plan (NestedTooDeep)
        raise LauncherError(
            f"the plan file {path} is not a plan ({type(exc).__name__}): "
            "write it with `launcher plan --json > FILE` or `launcher tune`"
        ) from exc
    if not isinstance(data, dict):
        raise LauncherError(f"the plan file {path} does not hold a plan object")
    return data


ENGINE_KEY_ENV = "TOPOSERVE_ENGINE_API_KEY"


def engine_key(env: Mapping[str, str], extra: Sequence[str] = ()) -> str:
    """vLLM's key for this run: the user's own `-- --api-key K` (vLLM takes it over
    VLLM_API_KEY, so the proxy must send that one), else TOPOSERVE_ENGINE_API_KEY where the user
    wants to reach the engine directly too (loadgen against the engine's port), else a new
    random one."""
    return (last_value(extra, "--api-key") or env.get(ENGINE_KEY_ENV, "").strip()
            or secrets.token_urlsafe(32))


def launch_spec(planned: Planned, request: ServeRequest) -> LaunchSpec:
    """What `launcher serve` starts for ``planned``: its engines behind the proxy ``request``
    asks for."""
    replicas = replica_specs(planned.rendered.engines, supervise.reachable_host)
    place = planned.request.engine.place
    headless = place is not None and place.headless
    return LaunchSpec(
        model_ref=planned.model_ref, served_name=planned.served_name, host=request.host,
        port=request.port, api_keys=request.api_keys, replicas=replicas,
        plan_info=plan_labels(planned.plan, planned.served_name),
        summary=summary_lines(planned.plan, replicas, planned.model_ref,
                              planned.rendered.notes),
        # A new key every run: only this run's proxy knows it, so a web page that finds
        # vLLM's loopback port cannot drive it. A headless node serves no API.
        engine_api_key=None if headless else engine_key(planned.env, planned.extra_args),
        proxy_args=request.proxy_args,
    )


def plan_labels(chosen: Plan, served: str) -> dict[str, str]:
    return {
        "mode": str(chosen.mode), "tp": str(chosen.tp), "pp": str(chosen.pp),
        "dp": str(chosen.dp), "engine": str(chosen.engine),
        "transport": str(chosen.transport), "model": served,
        "gpus": ",".join(str(g) for g in chosen.gpus) or "cpu",
    }


def summary_lines(chosen: Plan, replicas: Sequence[ReplicaSpec], model_ref: str,
                  notes: Sequence[str] = ()) -> tuple[str, ...]:
    lines = [f"[bold]Plan:[/] {chosen.mode} (tp={chosen.tp} pp={chosen.pp} dp={chosen.dp}, "
             f"engine {chosen.engine}) for {model_ref}"]
    lines += [f"  • {reason}" for reason in chosen.reasons]
    pred = chosen.predicted
    if chosen.engine != "cpu":
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

