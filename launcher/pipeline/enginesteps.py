"""The CPU engine's costs on this machine: timed by `probe --measure` where there is no GPU,
attached to this machine's topology when planning here.

Composes the stages (the embedded model from :mod:`launcher.model`, its plan and engine command
from :mod:`launcher.planner` and :mod:`launcher.engine`, the timing and cache from
:mod:`launcher.probe.enginestep`), which the layering lets only the pipeline and the CLI do.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from launcher.engine import supervise
from launcher.engine.detect import engine_argv, engine_prefix
from launcher.engine.render import render
from launcher.engine.serve import Cutting, StopCut
from launcher.model.modelspec import load_model_spec
from launcher.model.tinymodel import default_cache_dir, ensure_tiny_model
from launcher.planner.costmodel import (
    Prediction,
    attention_work,
    cpu_attention_fit,
    streamed_weight_bytes,
)
from launcher.planner.plan import Policy, plan
from launcher.probe import enginestep, kernelprobe, kernels
from launcher.probe.topology import Topology
from topocommon import jsontext

# How long the engine may take to start: 1-3 minutes on two busy cores, compiling its graph.
START_TIMEOUT_S = 600.0
SERVED_NAME = "toposerve-engine-step"


def key_here(env: Mapping[str, str]) -> enginestep.StepKey:
    """This CPU, this vLLM, this torch: a measurement from any other is not this machine's."""
    device = kernels.cpu_device_name(kernelprobe.cpuinfo(), os.cpu_count() or 1)
    return enginestep.StepKey(device, kernelprobe.vllm_version(), kernelprobe.dist_version("torch"))


def attach(topo: Topology, env: Mapping[str, str]) -> Topology:
    """``topo`` with the engine step kept for this machine, when ``topo`` is this machine's
    reading without GPUs (a saved topology is another machine's; GPUs plan from their tables)."""
    if topo.gpus or topo.source != "nvml":
        return topo
    step, why = enginestep.read(default_cache_dir(env), key_here(env))
    if step is None:  # none kept, or one that cannot be used: its line in the plan's reasons
        return replace(topo, notes=(*topo.notes, why)) if why else topo
    return replace(topo, engine_step=step)


def _vocab(model: Path) -> int:
    try:
        cfg = jsontext.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        cfg = None
    vocab = cfg.get("vocab_size") if isinstance(cfg, dict) else None
    return vocab if isinstance(vocab, int) and vocab > 8 else 1000


def _started(model: Path, env: Mapping[str, str], log: Path) -> tuple[supervise.Child, str]:
    """The embedded model's engine as `serve` runs it here (its plan's command, this
    interpreter's vLLM), on a free loopback port; raises :class:`EngineStepError` (one line)
    when it does not come up."""
    spec = load_model_spec(str(model))
    p = plan(Topology(gpus=()), spec, Policy(cpu_cores=os.cpu_count() or 1))
    port = supervise.free_port()
    cmd = render(p, str(model), served_name=SERVED_NAME, host="127.0.0.1", port=port,
                 user_env=env).engines[0]
    child = supervise.Child("engine-step", engine_argv(cmd.argv(), engine_prefix(env)),
                            {**env, **cmd.env, "VLLM_TARGET_DEVICE": "cpu"}, log)
    try:
        child.start()
    except OSError as exc:  # the cache's log folder not writable, no such interpreter
        raise enginestep.EngineStepError(f"cannot start the engine to time: {exc}") from None
    up = supervise.wait_until(lambda: supervise.http_ok(f"{cmd.url}/health"), START_TIMEOUT_S,
                              abort=lambda: not child.alive())
    if not up:
        tail = " | ".join(child.log_tail(4000).strip().splitlines()[-3:])
        child.stop(10.0)
        why = (f"exited with {child.exit_code()}" if child.exit_code() is not None
               else f"was not up after {START_TIMEOUT_S:.0f} s")
        raise enginestep.EngineStepError(f"the engine to time {why}: {tail[:300]}")
    return child, cmd.url


def measure(env: Mapping[str, str], served: enginestep.Served | None = None, *,
            depth: int = enginestep.DEPTH_CONTEXT, batch: int = enginestep.BATCH_STREAMS,
            cut: Cutting = nullcontext) -> str:
    """Time the CPU engine here as loadgen measures it (the real vLLM OpenAI server on the
    embedded model: ``served`` when one is up, else one started for it) and keep the figures;
    the line to print. ``depth``: the cached context the attention timing puts before its new
    tokens (0: not timed, ~10 s shorter on two cores); ``batch``: the streams the step at many
    sequences is timed with (0: not timed, a few seconds shorter). ``cut``: the window in which
    a stop ends the timing at once (serve's SignalGuard.cutting, raising StopCut): its requests
    only, so that a stop never lands in the saving of a record (nothing kept, or all of it)."""
    path = ensure_tiny_model(env)
    spec = load_model_spec(str(path))
    cache = default_cache_dir(env)
    child = None
    if served is None:
        log = cache / "engine-step" / "engine.log"
        child, url = _started(path, env, log)
        served = enginestep.Served(url, SERVED_NAME)
    try:
        with cut():
            timed = enginestep.time_served(served, _vocab(path), depth=depth, batch=batch)
    finally:
        if child is not None:
            child.stop(10.0)
    rec = enginestep.record(key_here(env), timed, params=spec.active_params,
                            weight_bytes=int(streamed_weight_bytes(spec, 1)),
                            token_params=spec.token_params, head_params=spec.lm_head_params,
                            pair_flops=attention_work(spec, 1, pairs=1.0).flops)
    kept = enginestep.save(cache, rec)
    where = f"kept in {kept}" if kept else "not kept (the cache cannot be written)"
    fixed, per_token = rec.prefill_fixed_s or 0.0, rec.prefill_token_s or 0.0
    fit = cpu_attention_fit(rec)
    deep = ("attention over a cached context not timed (the engine reports no cached tokens)"
            if fit is None else
            f"{rec.depth_new_tokens} new tokens after {rec.depth_tokens:,} cached, each round "
            f"against a plain {rec.depth_new_tokens} ("
            + ", ".join(f"{(p.deep_s - p.plain_s) * 1e3:+.0f} ms" for p in rec.depth_pairs)
            + f"): {fit.why}")
    many = rec.batch_step_s
    wide = (f"a step of {batch} streams not timed" + ("" if batch < 2 else
            " (no round of them could be read: see the rounds not read as they came)")
            if many is None else
            f"a step of {rec.batch_streams} streams {many * 1e3:.2f} ms median of "
            f"{len(rec.batch_steps_s)} rounds ("
            + ", ".join(f"{s * 1e3:.2f}" for s in rec.batch_steps_s) + " ms)")
    # a round not read as it came is said with its reason (the tokens the server held back on
    # a loaded machine) and what was done: its step read from the stream's end, or not kept
    unread = rec.unread_rounds
    dropped = (f"; {len(unread)} round(s) not read as they came ({unread[0]}"
               + (f"; and {len(unread) - 1} more" if len(unread) > 1 else "") + ")"
               if unread else "")
    return (f"engine on {rec.key.device} (vLLM {rec.key.vllm}), served and streamed: decode step "
            f"{rec.step_s * 1e3:.2f} ms median of {len(rec.steps_s)} rounds "
            f"({min(rec.steps_s) * 1e3:.2f}-{max(rec.steps_s) * 1e3:.2f} ms); first token "
            f"{fixed * 1e3:.1f} ms + {per_token * 1e6:.1f} us per prompt token; {wide}; {deep}"
            f"{dropped}; {where}")



# What `serve` does about the CPU engine's timing before its first plan reaches a user.
TIME = "time"  # time the engine serve has just started (the embedded model, no record here)
HINT = "hint"  # another model on the CPU, no record here: say that `probe --measure` times it
HINT_LINE = ("this machine's CPU engine is not timed yet, so the plan above is the assumed one: "
             "`launcher probe --measure` once times this machine's CPU engine, and every later "
             "plan here uses it")

Timer = Callable[[Mapping[str, str], enginestep.Served], str]


@dataclass(frozen=True)
class Calibrated:
    """What `serve`'s timing of its CPU engine came to: ``ok`` when the record was kept and the
    plan made from it (``line`` then has its figures), else the one line saying what failed,
    the serve going on with the assumed plan."""

    ok: bool
    line: str


def first_serve(env: Mapping[str, str], *, engine: str, single: bool, default_model: bool,
                planned_here: bool, calibrate: bool) -> str | None:
    """:data:`TIME`, :data:`HINT` or None: whether `serve` times the CPU engine it starts. Only
    this machine's own plan (``planned_here``: no --plan, no --topology, one node) of the CPU
    engine as one process (``single``), and only while no timing is kept for this machine (the
    key :func:`attach` reads); the timing is of the embedded model (``default_model``), whose
    vocabulary and shapes :func:`measure` uses, so another model only gets the hint."""
    if not calibrate or engine != "cpu" or not single or not planned_here:
        return None
    if enginestep.load(default_cache_dir(env), key_here(env)) is not None:
        return None
    return TIME if default_model else HINT


def calibrate_served(env: Mapping[str, str], served: enginestep.Served, assumed: Prediction,
                     replan: Callable[[], Prediction], *, timer: Timer | None = None,
                     clock: Callable[[], float] = time.monotonic,
                     cut: Cutting = nullcontext) -> Calibrated:
    """Time the engine ``served`` (just started by `serve`, not yet behind the proxy) with
    ``timer`` (:func:`measure`, its requests within ``cut``), which keeps the record, then plan
    again (``replan``: the same request, which :func:`attach` now gives the record) and say
    both. A failure anywhere is one line (not ``ok``), the serve going on with the assumed plan;
    a stop that cut the timing (StopCut) is one line too, nothing kept, the caller stopping."""
    run = timer or (lambda e, s: measure(e, served=s, cut=cut))
    started = clock()
    try:
        run(env, served)
    except StopCut:
        return Calibrated(False, f"timing this machine's CPU engine cut short by the stop "
                          f"({clock() - started:.0f} s in): nothing kept, the next serve "
                          "times it")
    except Exception as exc:  # any failure of the timing is one line, never fatal
        return Calibrated(False, f"timing this machine's CPU engine failed ({_one_line(exc)}); "
                          "serving on the assumed plan")
    took = clock() - started
    if enginestep.load(default_cache_dir(env), key_here(env)) is None:
        return Calibrated(False, f"timed this machine's CPU engine ({took:.0f} s) but the cache "
                          f"({default_cache_dir(env)}) did not keep it; serving on the assumed "
                          "plan")
    try:
        pred = replan()
    except Exception as exc:
        return Calibrated(False, f"timed this machine's CPU engine once ({took:.0f} s, kept for "
                          f"later plans), but planning with it failed ({_one_line(exc)}); "
                          "serving on the assumed plan")
    return Calibrated(True, f"timed this machine's CPU engine once ({took:.0f} s, kept for "
                      f"later plans): predicted prefill {pred.prefill_tok_s:,.0f} tok/s, decode "
                      f"{pred.decode_tok_s:,.1f} tok/s (the assumed plan said "
                      f"{assumed.prefill_tok_s:,.0f}/{assumed.decode_tok_s:,.1f})")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
