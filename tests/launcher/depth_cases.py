"""Issue 24's recorded H200 cases (tests/fixtures/depth/issue24-h200.json) as the planner predicts
them now: TTFT at depth (cached and cold) and the agent soak's TTFT per turn, beside what was
measured and what the plan printed on the machine before the runs. test_depth.py bounds the
errors; docs/benchmarks-loadgen.md keeps the table this prints:

    .venv/bin/python -m tests.launcher.depth_cases
"""

from __future__ import annotations

import functools
import json
import statistics
from dataclasses import dataclass, replace
from typing import Any

from launcher.model.modelspec import GIB, ModelSpec, spec_from_config
from launcher.pipeline.run import plan_with_agent
from launcher.planner import agent
from launcher.planner.agent import AgentAsk, Room
from launcher.planner.plantypes import Policy
from launcher.planner.schedsim import SessionsResult, Turn
from launcher.probe.topology import load_topology
from tests.launcher.gpushapes import RECORDS_GRAPHS
from tests.launcher.paths import H200, REPO

FIXTURE = REPO / "tests" / "fixtures" / "depth" / "issue24-h200.json"


@dataclass(frozen=True)
class Case:
    label: str
    measured_s: float
    before_s: float | None  # the plan on the machine before the run (None: it gave none)
    after_s: float  # the planner now
    together_s: float | None = None  # soak only: the sessions sending all at once

    @property
    def error(self) -> float:
        return (self.after_s - self.measured_s) / self.measured_s


@functools.cache
def recorded() -> Any:
    return json.loads(FIXTURE.read_text())


@functools.cache
def spec(name: str) -> ModelSpec:
    return spec_from_config(recorded()["models"][name], name)


def room(name: str, util: float, ask: AgentAsk) -> Room:
    """The agent plan's 16-bit room on one H200 of the fixture topology, at that utilization."""
    policy = Policy(gpu_memory_utilization=util, force_tp=1, force_pp=1, force_dp=1,
                    prompt_tokens=ask.turn_tokens, gen_tokens=ask.gen_tokens)
    _, ap = plan_with_agent(load_topology(str(H200), {}), spec(name), policy, ask,
                            int(recorded()["host_free_gib"] * GIB))
    assert ap is not None
    return next(r for r in ap.rooms if r.kv_dtype == "auto")


def depth_cases() -> list[Case]:
    out = []
    for c in recorded()["depth"]:
        d, new = c["depth"], c["new"]
        r = room(c["model"], c["gpu_memory_utilization"],
                 AgentAsk(1, max(1, d), new, c["gen"]))
        assert r.lay is not None
        assert r.limits is not None
        # the records' engines captured CUDA graphs to 64 tokens (agent_turns.sh's default)
        lay = replace(r.lay, graphs=RECORDS_GRAPHS.on())
        warm, cold = agent.turn_ttft_s(spec(c["model"]), lay, d, new, r.limits.batched_tokens)
        out.append(Case(f"{c['model']} {d:,} {'cold' if c['cold'] else 'cached'}",
                        c["measured_ttft_p50_s"], c["before_s"], cold if c["cold"] else warm))
    return out


def soak_result(run: Any, think_s: float | None) -> SessionsResult:
    """The run's turns through the agent plan's own simulation (agent.simulate_turns: its room's
    scheduler limits and KV blocks, its step timer, the host copy where it offloaded, loadgen's
    turns: the answers resent as text, the system prompt common to the sessions)."""
    name = run.get("model", "llama-3.1-8b-longctx-shape")
    n = len(run.get("measured_ttft_p50_s") or run["measured_e2e_p50_s"])
    turns = [Turn(run["first_prompt"] + i * run["turn_tokens"], run["gen"]) for i in range(n)]
    last = turns[-1].prompt - run["turn_tokens"]
    r = room(name, run["gpu_memory_utilization"],
             AgentAsk(run["sessions"], last, run["turn_tokens"], run["gen"]))
    return agent.simulate_turns(spec(name), r, turns, run["sessions"], think_s=think_s,
                                offload=run["offload"], max_steps=0,
                                common_tokens=agent.loadgen_common_tokens(run["first_prompt"]))


def soak_ttft_s(run: Any, think_s: float | None, *, whole: bool = False) -> list[float]:
    """The median session's TTFT per turn of :func:`soak_result` (``whole``: from its send to
    its answer's end)."""
    res = soak_result(run, think_s)
    if whole:
        return [statistics.median(r.finished_s - r.sent_s for r in turn) for turn in res.turns]
    return [res.ttft(i).p50 for i in range(len(res.turns))]


def whole_cases() -> list[Case]:
    """The 32B soak, whose answers came in one chunk: send-to-end per turn, loadgen's
    arrivals (no plan on the machine gave this figure)."""
    out = []
    for run in recorded()["soak_whole"]:
        now = soak_ttft_s(run, run["think_s"], whole=True)
        for i, meas in enumerate(run["measured_e2e_p50_s"]):
            out.append(Case(f"{run['file']} turn {i + 1}", meas, None, now[i]))
    return out


def soak_cases() -> list[Case]:
    out = []
    before = recorded()["soak_before_lone_cached_s"]
    for run in recorded()["soak"]:
        now = soak_ttft_s(run, run["think_s"])
        together = soak_ttft_s(run, None)
        for i, meas in enumerate(run["measured_ttft_p50_s"]):
            out.append(Case(f"{run['file']} turn {i + 1}", meas, before[i], now[i],
                            together[i]))
    return out


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:,.1f}"


def _cell(pred: float | None, meas: float) -> str:
    return "-" if pred is None else f"{pred * 1e3:,.1f} ({(pred - meas) / meas:+.0%})"


def main() -> None:
    print("| case | measured | before | after |")
    print("| --- | ---: | ---: | ---: |")
    for c in depth_cases():
        print(f"| {c.label} | {_ms(c.measured_s)} | {_cell(c.before_s, c.measured_s)}"
              f" | {_cell(c.after_s, c.measured_s)} |")
    print()
    print("| run, turn | measured | before (lone turn, on the machine) | after, all at once "
          "| after, loadgen's arrivals |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for c in soak_cases():
        print(f"| {c.label} | {_ms(c.measured_s)} | {_cell(c.before_s, c.measured_s)}"
              f" | {_cell(c.together_s, c.measured_s)} | {_cell(c.after_s, c.measured_s)} |")
    print()
    print("| run, turn (answers in one chunk) | measured send-to-end | simulated |")
    print("| --- | ---: | ---: |")
    for c in whole_cases():
        print(f"| {c.label} | {_ms(c.measured_s)} | {_cell(c.after_s, c.measured_s)} |")


if __name__ == "__main__":
    main()
