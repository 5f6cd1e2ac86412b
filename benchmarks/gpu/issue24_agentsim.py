"""The agent plan's simulation of the issue-24 H200 agent soak, turn by turn, beside what was
measured (benchmarks/gpu/results/2026-12-02-h200): four (or one) sessions of the 8B shape growing
from 2,001 to 34,033 prompt tokens by 4,004 a turn, 64 answered, at --gpu-memory-utilization 0.9
(all sessions in the GPU cache) and 0.15 (GPU cache alone; with the plan's KV offloading).

    python benchmarks/gpu/issue24_agentsim.py [RESULTS_DIR]

The prediction is the plan's own machinery (launcher.planner.agent.simulate_turns: the
scheduler, step timer and host copy, the sessions arriving as loadgen sent them) on the turns
loadgen sent, planned for the H200 fixture the docs use
(tests/fixtures/topologies/h200x2-nvlink.nvml.json, one GPU) with 125 GiB of free host memory.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from launcher.model.modelspec import GIB, load_model_spec
from launcher.pipeline.run import plan_with_agent
from launcher.planner import agent
from launcher.planner.agent import AgentAsk
from launcher.planner.plantypes import Policy
from launcher.planner.schedsim import Turn
from launcher.probe.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
RUNS = {  # (utilization, sessions, offload): the measured run's file
    (0.9, 1, False): "agent09/agent-lone.json",
    (0.9, 4, False): "agent09/agent-4.json",
    (0.15, 4, False): "depth8b/agent-gpu-only.json",
    (0.15, 4, True): "offload8b/agent-offload.json",
}
TURNS = [Turn(2001 + i * 4004, 64) for i in range(9)]
THINK_S = 1.0  # the runs' --think (loadgen's default)


def measured(path: Path) -> list[float]:
    reqs = json.loads(path.read_text())["requests"]
    by_prompt: dict[int, list[float]] = {}
    for r in reqs:
        by_prompt.setdefault(r["prompt_tokens"], []).append(r["ttft_s"])
    return [statistics.median(by_prompt[t.prompt]) for t in TURNS]


def predicted(util: float, sessions: int, offload: bool) -> list[float]:
    m = load_model_spec(str(ROOT / "benchmarks/gpu/models/llama-3.1-8b-longctx-shape"))
    topo = load_topology(str(ROOT / "tests/fixtures/topologies/h200x2-nvlink.nvml.json"), {})
    ask = AgentAsk(sessions, 30029, 4004, 64)
    _, ap = plan_with_agent(topo, m, Policy(gpu_memory_utilization=util, force_tp=1,
                                            force_pp=1, force_dp=1), ask, 125 * GIB)
    assert ap is not None
    r = next(x for x in ap.rooms if x.kv_dtype == "auto")
    # the sessions as loadgen sent them (--think 1: staggered, a think time after each answer;
    # the answers resent as text; one system prompt), through the agent plan's own simulation
    res = agent.simulate_turns(m, r, TURNS, sessions, think_s=THINK_S, offload=offload,
                               max_steps=0,
                               common_tokens=agent.loadgen_common_tokens(TURNS[0].prompt))
    return [res.ttft(i).p50 for i in range(len(TURNS))]


def main() -> None:
    results = Path(sys.argv[1]) if len(sys.argv) > 1 else \
        ROOT / "benchmarks/gpu/results/2026-12-02-h200"
    for (util, sessions, offload), name in RUNS.items():
        meas = measured(results / name)
        pred = predicted(util, sessions, offload)
        print(f"{sessions} session(s) at {util}{' with offload' if offload else ''} ({name})")
        for i, (p, q) in enumerate(zip(pred, meas, strict=True)):
            print(f"  turn {i + 1}  prompt {TURNS[i].prompt:>6,}  predicted {p * 1e3:8.1f} ms  "
                  f"measured {q * 1e3:8.1f} ms  {100 * (p - q) / q:+5.0f}%")


if __name__ == "__main__":
    main()
