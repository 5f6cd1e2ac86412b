"""The agent plan's simulation of issue 24's H200 agent soaks, turn by turn, beside what was
measured: four (or one) sessions of the 8B shape growing from 2,001 to 34,033 prompt tokens by
4,004 a turn at --gpu-memory-utilization 0.9 (all sessions in the GPU cache) and 0.15 (GPU cache
alone; with the plan's KV offloading) (benchmarks/gpu/results/2026-12-02-h200); four of the
Qwen3-32B shape growing from 2,001 to 34,017 by 8,004 at 0.55, plain and with the plan's
offload (2026-12-02-h200-soak32b); 64 tokens answered, --think 1.

    python benchmarks/gpu/issue24_agentsim.py

The prediction is the plan's own machinery (launcher.planner.agent.simulate_turns: the
scheduler, step timer and host copy, the sessions arriving as loadgen sent them) on the turns
loadgen sent, planned for the H200 fixture the docs use
(tests/fixtures/topologies/h200x2-nvlink.nvml.json, one GPU) with 125 GiB of free host memory.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from launcher.model.modelspec import GIB, load_model_spec
from launcher.pipeline.run import plan_with_agent
from launcher.planner import agent
from launcher.planner.agent import AgentAsk
from launcher.planner.plantypes import Policy
from launcher.planner.schedsim import Turn
from launcher.probe.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks/gpu/results"


@dataclass(frozen=True)
class Soak:
    """One measured agent run: loadgen --workload agent --think 1 --gen 64, its turns' prompts
    first + i × step tokens, on one H200 at ``util``."""

    file: str  # under RESULTS
    model: str  # under benchmarks/gpu/models
    util: float
    sessions: int
    offload: bool
    first: int
    step: int
    turns: int

    def turn_list(self) -> list[Turn]:
        return [Turn(self.first + i * self.step, 64) for i in range(self.turns)]


EIGHT = "llama-3.1-8b-longctx-shape"
QWEN3 = "qwen3-32b-shape"
RUNS = (  # session 8's 8B soaks, session 10's 32B soak (plain, and with the plan's offload)
    Soak("2026-12-02-h200/agent09/agent-lone.json", EIGHT, 0.9, 1, False, 2001, 4004, 9),
    Soak("2026-12-02-h200/agent09/agent-4.json", EIGHT, 0.9, 4, False, 2001, 4004, 9),
    Soak("2026-12-02-h200/depth8b/agent-gpu-only.json", EIGHT, 0.15, 4, False, 2001, 4004, 9),
    Soak("2026-12-02-h200/offload8b/agent-offload.json", EIGHT, 0.15, 4, True, 2001, 4004, 9),
    Soak("2026-12-02-h200-soak32b/soak32b/agent-gpu-only.json", QWEN3, 0.55, 4, False, 2001,
         8004, 5),
    Soak("2026-12-02-h200-soak32b/offload32b/agent-offload.json", QWEN3, 0.55, 4, True, 2001,
         8004, 5),
)
THINK_S = 1.0  # the runs' --think (loadgen's default)


def measured(run: Soak) -> tuple[list[float], bool]:
    """TTFT p50 per turn, and whether every answer came in one streamed chunk (its TTFT is then
    the whole answer's time: session 10's 32B soak, whose served chat stream the engine sent
    at the end)."""
    reqs = json.loads((RESULTS / run.file).read_text())["requests"]
    by_prompt: dict[int, list[float]] = {}
    for r in reqs:
        by_prompt.setdefault(r["prompt_tokens"], []).append(r["ttft_s"])
    one_chunk = all(r.get("chunks") == 1 for r in reqs)
    return [statistics.median(by_prompt[t.prompt]) for t in run.turn_list()], one_chunk


def predicted(run: Soak, *, whole: bool = False) -> list[float]:
    """The median session's TTFT per turn (``whole``: its answer's end, from the send)."""
    m = load_model_spec(str(ROOT / "benchmarks/gpu/models" / run.model))
    topo = load_topology(str(ROOT / "tests/fixtures/topologies/h200x2-nvlink.nvml.json"), {})
    turns = run.turn_list()
    ask = AgentAsk(run.sessions, turns[-1].prompt - run.step, run.step, 64)
    _, ap = plan_with_agent(topo, m, Policy(gpu_memory_utilization=run.util, force_tp=1,
                                            force_pp=1, force_dp=1), ask, 125 * GIB)
    assert ap is not None
    r = next(x for x in ap.rooms if x.kv_dtype == "auto")
    # the sessions as loadgen sent them (--think 1: staggered, a think time after each answer;
    # the answers resent as text; one system prompt), through the agent plan's own simulation
    res = agent.simulate_turns(m, r, turns, run.sessions, think_s=THINK_S, offload=run.offload,
                               max_steps=0,
                               common_tokens=agent.loadgen_common_tokens(turns[0].prompt))
    if whole:
        return [statistics.median(r.finished_s - r.sent_s for r in res.turns[i])
                for i in range(len(turns))]
    return [res.ttft(i).p50 for i in range(len(turns))]


def main() -> None:
    for run in RUNS:
        meas, one_chunk = measured(run)
        pred = predicted(run, whole=one_chunk)
        print(f"{run.model}: {run.sessions} session(s) at {run.util}"
              f"{' with offload' if run.offload else ''} ({run.file})"
              + (": every answer came in one chunk, so its TTFT is the whole answer's time,"
                 " predicted as that" if one_chunk else ""))
        for i, (p, q) in enumerate(zip(pred, meas, strict=True)):
            print(f"  turn {i + 1}  prompt {run.first + i * run.step:>6,}  predicted "
                  f"{p * 1e3:8.1f} ms  measured {q * 1e3:8.1f} ms  {100 * (p - q) / q:+5.0f}%")


if __name__ == "__main__":
    main()
