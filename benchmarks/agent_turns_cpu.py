"""The agent plan's simulated time to first token per turn beside what loadgen's agent workload
measures, on the CPU engine (issue 24): the engine is timed as `launcher probe --measure` times
it (its step and its first-token line, through the served engine), loadgen runs its agent
sessions against the same engine, and the plan's own simulation (launcher.planner.agent
simulate_turns with the CPU engine's CpuStep) takes the turns loadgen sent (their counted
prompts, the sessions' system prompt, its --think arrivals), round after round.

    python benchmarks/agent_turns_cpu.py --url http://127.0.0.1:8000 [--key KEY] \\
        [--model-path DIR] [--sessions 3] [--turns 6] [--context 800:3600] [--gen 16] \\
        [--think 0.3] [--rounds 2]

The URL is a vLLM CPU engine serving the embedded tiny model (`launcher serve` runs one; its key
is TOPOSERVE_ENGINE_API_KEY). Prints a table per round and each turn's error.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launcher.model.modelspec import load_model_spec
from launcher.model.tinymodel import ensure_tiny_model
from launcher.pipeline import enginesteps
from launcher.planner import agent, costmodel
from launcher.planner.agent import AgentAsk
from launcher.planner.plantypes import Policy
from launcher.planner.schedsim import Turn
from launcher.probe import enginestep
from launcher.probe.enginestep import EngineStep
from launcher.probe.topology import Topology
from loadgen.api import run as loadgen_run
from loadgen.config import Config
from loadgen.outputs.results import Report


@dataclass(frozen=True)
class Round:
    step: EngineStep
    pair: tuple[float, float, float]  # pair_s()
    prompts: list[int]  # per turn, the sessions' median prompt tokens
    measured_s: list[float]  # per turn, TTFT p50 over the sessions
    predicted_s: list[float]  # per turn, the simulation's median session, loadgen's attention
    plan_s: list[float]  # the same with the attention probe --measure timed (the plan's own)
    flat_s: list[float]  # the same without attention over the context (the plan before it)
    hit: list[float | None]  # per turn, usage's cached share


def timed_step(url: str, key: str | None, model: str, cache: Path) -> EngineStep:
    """`probe --measure`'s timing of the served engine, kept in (and read back from) ``cache``."""
    env = {**os.environ, "TOPOSERVE_CACHE": str(cache)}
    if not (cache / "models").exists():  # the embedded model as generated already
        (cache / "models").symlink_to(ensure_tiny_model().parent)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    enginesteps.measure(env, enginestep.Served(url, model, headers))
    topo = enginesteps.attach(Topology(gpus=(), source="nvml"), env)
    assert topo.engine_step is not None
    return topo.engine_step


def pair_s(url: str, key: str | None, depth: int, new: int,
           token_s: float) -> tuple[float, float, float]:
    """Attention over a cached context on this engine: loadgen's TTFT of ``new`` tokens after
    ``depth`` cached ones against after none. vLLM caches whole blocks (128 tokens on the CPU),
    so the deeper request computes ``new`` + the context's uncached tail: that tail at the
    engine's timed ``token_s`` a prompt token, the host's cost of the cached tokens
    (PROMPT_TOKEN_HOST_S, the simulation's own), and the rest is attention, per (query, key)
    pair of the computed tokens over the cached ones; (seconds a pair, TTFT at 0, TTFT at
    depth)."""
    cfg = Config(url=url, api_key=key, depth=(0, depth), prompt=new, gen=4, requests=4,
                 progress=False)
    at, cached = {}, {}
    for lv in loadgen_run(cfg).levels:
        assert lv.depth is not None
        at[lv.depth.tokens] = lv.summary.ttft_s.p50 or 0.0
        cached[lv.depth.tokens] = statistics.median(r.cached_tokens or 0 for r in lv.requests)
    hit = cached[depth]
    computed = new + depth - hit
    extra = (at[depth] - at[0] - (computed - new) * token_s
             - depth * costmodel.PROMPT_TOKEN_HOST_S)
    return max(0.0, extra / (computed * hit)) if hit else 0.0, at[0], at[depth]


def agent_run(url: str, key: str | None, sessions: int, turns: int, context: tuple[int, int],
              gen: int, think_s: float) -> Report:
    cfg = Config(url=url, api_key=key, workload="agent", chat=True, sessions=sessions,
                 turns=turns, context=context, gen=gen, think_s=think_s, progress=False)
    return loadgen_run(cfg)


def simulated(model_path: str, step: EngineStep, report: Report, cores: int,
              pair: float) -> list[float]:
    """The plan's simulation of the run's turns on the CPU engine timed as ``step``, attention
    over the context at ``pair`` seconds a (query, key) pair."""
    assert report.agent is not None
    a = report.agent
    m = load_model_spec(model_path)
    gen = report.config.gen
    turns = [Turn(round(t.prompt_tokens.p50 or 1), gen) for t in a.per_turn]
    policy = Policy(cpu_cores=cores)
    ask = AgentAsk(a.sessions, turns[-1].prompt, max(1, turns[-1].prompt - turns[0].prompt),
                   gen, a.think_s)
    ap = agent.cpu_agent_plan(m, policy, ask, Topology(gpus=(), engine_step=step))
    timer = agent.CpuStep(m, cores, costmodel.cpu_step_overhead(step, cores), pair)
    res = agent.simulate_turns(m, ap.room, turns, a.sessions, think_s=a.think_s, offload=False,
                               common_tokens=agent.loadgen_common_tokens(a.context[0]),
                               timer=timer, request_overhead_s=timer.way_in_s, max_steps=0)
    return [res.ttft(i).p50 for i in range(len(turns))]


def one_round(url: str, key: str | None, model: str, model_path: str, cache: Path,
              args: argparse.Namespace) -> Round:
    step = timed_step(url, key, model, cache)
    pair = pair_s(url, key, args.depth, args.depth_new, step.prefill_token_s or 0.0)
    report = agent_run(url, key, args.sessions, args.turns, args.context, args.gen, args.think)
    assert report.agent is not None
    per = report.agent.per_turn
    assert all(t.requests_failed == 0 for t in per), [t.requests_failed for t in per]
    cores = os.cpu_count() or 1
    return Round(step, pair, [round(t.prompt_tokens.p50 or 0) for t in per],
                 [t.ttft_s.p50 or 0.0 for t in per],
                 simulated(model_path, step, report, cores, pair[0]),
                 simulated(model_path, step, report, cores,
                           costmodel.cpu_attention_pair_s(step) or 0.0),
                 simulated(model_path, step, report, cores, 0.0),
                 [t.cache_hit_rate for t in per])


def pair(text: str) -> tuple[int, int]:
    first, last = text.split(":")
    return int(first), int(last)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--key", default=os.environ.get("TOPOSERVE_ENGINE_API_KEY"))
    p.add_argument("--model", default="toposerve-tiny", help="the served model's name")
    p.add_argument("--model-path", default=None, help="its directory (default: the embedded)")
    p.add_argument("--sessions", type=int, default=3)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--context", type=pair, default=(800, 3600))
    p.add_argument("--gen", type=int, default=16)
    p.add_argument("--think", type=float, default=0.3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--depth", type=int, default=2000, help="the attention timing's context")
    p.add_argument("--depth-new", type=int, default=256, help="its new tokens")
    args = p.parse_args()
    model_path = args.model_path or str(ensure_tiny_model())
    errors: list[list[float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            r = one_round(args.url, args.key, args.model, model_path, Path(tmp), args)
            fixed = (r.step.prefill_fixed_s or 0) * 1e3
            per_tok = (r.step.prefill_token_s or 0) * 1e6
            probe_pair = costmodel.cpu_attention_pair_s(r.step) or 0.0
            print(f"round {i + 1}: engine step {r.step.step_s * 1e3:.2f} ms, first token "
                  f"{fixed:.1f} ms + {per_tok:.1f} us per prompt token; {args.depth_new} new "
                  f"tokens after 0 / {args.depth:,} cached: {r.pair[1] * 1e3:.1f} / "
                  f"{r.pair[2] * 1e3:.1f} ms, {r.pair[0] * 1e9:.1f} ns a (query, key) pair; "
                  f"probe --measure's timing at depth: {probe_pair * 1e9:.1f} ns a pair")
            print("| turn | prompt | cached | measured TTFT p50 | the plan (probe's attention) "
                  "| error | loadgen --depth's attention | error | no attention | error |")
            print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            row = []
            for t, (n, meas, pred, planned, flat, hit) in enumerate(
                    zip(r.prompts, r.measured_s, r.predicted_s, r.plan_s, r.flat_s, r.hit,
                        strict=True)):
                err = (planned - meas) / meas
                row.append(err)
                share = "-" if hit is None else f"{hit:.0%}"
                print(f"| {t + 1} | {n:,} | {share} | {meas * 1e3:.1f} ms | "
                      f"{planned * 1e3:.1f} ms | {err:+.0%} | {pred * 1e3:.1f} ms | "
                      f"{(pred - meas) / meas:+.0%} | {flat * 1e3:.1f} ms | "
                      f"{(flat - meas) / meas:+.0%} |")
            errors.append(row)
    abs_err = [abs(e) for row in errors for e in row]
    print(f"{len(abs_err)} turns (the plan, probe's attention): median |error| "
          f"{statistics.median(abs_err):.0%}, max {max(abs_err):.0%}, within 15%: "
          f"{sum(e <= 0.15 for e in abs_err)}, within 25%: {sum(e <= 0.25 for e in abs_err)}")


if __name__ == "__main__":
    main()
