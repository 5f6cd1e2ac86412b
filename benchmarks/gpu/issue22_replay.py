"""Issue 22: the 32-stream first tokens of the saved one-GPU H200 records replayed through the
plan's own simulated scheduler, to split what the front end's way in and the engine core's
order add to the plan's figure. Read after the runs: agreement, not validation.

    .venv/bin/python benchmarks/gpu/issue22_replay.py

For each record with per-request timings (loadgen `--concurrency 32 --requests 64`, warm-up 8
requests in the session 9-10 runs, 32 in table3's; 512 -> 256): loadgen's TTFT p50 over its 64
requests, and per wave (wave 1: the 32 sent at once after the warm-up; wave 2: each stream's
second, sent as its first ended), beside

- plan: the plan's figure (loadsim.under_load: loadgen's default closed loop, 4 a stream);
- sends: the record's own send times through the plan's simulation (schedsim.Workload.arrivals):
  each request reaches the scheduler after the host profile's way in, the front end handing
  them over one at a time (request_serial_s, the profile's per-prompt-token work), and the
  engine core launches each step before it takes the step before's output, an eager step (one
  with prompt chunks) layer by layer at the profile's ``layer_launch_s`` (schedsim.LaunchTimer);
- way in: the same, each request reaching the scheduler when its response headers came
  (loadgen's headers_s, the front end's way in as it was; vLLM sends them once the request is
  parsed and validated, before its generator hands it to the engine core: a lower bound), its
  first token's way out the profile's. Not where the proxy held the response head until the
  first token (table3's runs: headers_s equals the TTFT there).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher.model.modelspec import ModelSpec, load_model_spec
from launcher.planner import loadsim
from launcher.planner.costmodel import Layout
from launcher.planner.cudagraphs import Requested
from launcher.planner.layouts import Links, Shape, best_candidate
from launcher.planner.plantypes import Policy
from launcher.planner.schedsim import (
    SchedulerLimits,
    StepBatch,
    Workload,
    percentiles,
    simulate,
)
from launcher.probe.topology import load_topology

# the runs' engines captured CUDA graphs up to 64 tokens (benchmarks/gpu/run_config.sh)
RUNS_GRAPHS = Requested(64)

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "gpu" / "results"
MODELS = REPO / "benchmarks" / "gpu" / "models"
# the H200's saved NVML reading, as issue22_now.py plans on it
TOPOLOGY = REPO / "benchmarks" / "gpu" / "results" / "2026-12-01-h200-lead" / "h200-probe.json"
# (record, model shape): the one-GPU 32-stream runs that kept each request's send time
CASES = [
    ("2026-12-02-h200-table/small/c32.json", "llama-3.2-1b-shape"),
    ("2026-12-02-h200-table2/small3b/c32.json", "llama-3.2-3b-shape"),
    ("2026-12-02-h200-table/qwen7b/c32.json", "qwen2.5-7b-shape"),
    ("2026-12-01-h200-issue14/dense/c32.json", "llama-3.1-8b-longctx-shape"),
    ("2026-12-02-h200-table/mla/c32.json", "deepseek-v2-lite-shape"),
    ("2026-12-01-h200-issue14/moe/c32.json", "qwen3-30b-a3b-shape"),
    ("2026-12-02-h200-table/gemma/c32.json", "gemma-3-27b-shape"),
    ("2026-12-02-h200-table/awq/c32.json", "qwen2.5-32b-awq-shape"),
    ("2026-12-02-h200-table2/qwen3/c32.json", "qwen3-32b-shape"),
    ("2026-12-02-h200-table3/smollm2/c32.json", "smollm2-1.7b-shape"),
    ("2026-12-02-h200-table3/gemma2/c32.json", "gemma-2-9b-shape"),
    ("2026-12-02-h200-table3/nemo12/c32.json", "mistral-nemo-12b-shape"),
    ("2026-12-02-h200-table3/long14/c32.json", "qwen2.5-14b-shape"),
    ("2026-12-02-h200-table3/awq14/c32.json", "qwen2.5-14b-awq-shape"),
    ("2026-12-02-h200-table3/moonlight/c32.json", "moonlight-16b-a3b-shape"),
]


@dataclass
class Launching:
    """The plan's step timer with the host's launch of each step (a schedsim.LaunchTimer)."""

    step: loadsim.RooflineStep
    m: ModelSpec
    lay: Layout

    def step_s(self, batch: StepBatch) -> float:
        return self.step.step_s(batch)

    def launch_s(self, batch: StepBatch) -> float:
        if batch.prefill_tokens == 0:
            return 0.0
        return self.m.num_layers * self.lay.host.layer_launch_s


def replay(lim: SchedulerLimits, timer: Launching, prompt: int, gen: int, sent: list[float],
           arrivals: list[float], overhead: float, serial: float) -> list[float]:
    """Each request's first token after its recorded send, requests reaching the scheduler
    ``overhead`` after ``arrivals``, at least ``serial`` apart."""
    res = simulate(lim, timer, Workload(prompt, gen, arrivals=tuple(arrivals)),
                   request_overhead_s=overhead, request_serial_s=serial)
    firsts = sorted(res.requests, key=lambda x: x.sent_s)
    return [f.first_token_s - s for f, s in zip(firsts, sent, strict=True)]


def p50(values: list[float]) -> float:
    return percentiles(values).p50


def waves(ttft: list[float], n: int) -> str:
    return f"{p50(ttft):.3f} ({p50(ttft[:n]):.3f} / {p50(ttft[n:]):.3f})"


def main() -> int:
    print("| record | measured: all (wave 1 / wave 2) | plan | sends | way in |")
    print("| --- | --- | ---: | --- | --- |")
    topo = load_topology(str(TOPOLOGY), {})
    for rel, shape in CASES:
        data = json.loads((RESULTS / rel).read_text())
        cfg = data["config"]
        rs = sorted((r for r in data["requests"] if r.get("error") is None),
                    key=lambda r: r["t_sent_s"])
        n, prompt, gen = int(cfg["concurrency"]), int(cfg["prompt"]), int(cfg["gen"])
        m = load_model_spec(str(MODELS / shape))
        util = 0.3 if "small3b" in rel else 0.9
        pol = Policy(workload="throughput", concurrency=n, force_tp=1, force_pp=1, force_dp=1,
                     gpu_memory_utilization=util, prompt_tokens=prompt, gen_tokens=gen)
        cand, lay = best_candidate(m, pol, Links(topo, RUNS_GRAPHS), list(topo.gpus),
                                   Shape(1, 1, 1))
        assert lay is not None
        assert cand.fit is not None
        assert cand.predicted is not None
        pred, _ = loadsim.under_load(m, lay, cand.fit, cand.predicted, prompt=prompt, gen=gen,
                                     concurrency=n, max_num_seqs=pol.max_num_seqs)
        assert isinstance(pred, loadsim.SimulatedPrediction)
        lim = loadsim.scheduler_limits(m, cand.fit, pol.max_num_seqs, prompt + gen,
                                       pp=lay.pp)
        sent = [float(r["t_sent_s"]) for r in rs]
        way_in = lay.host.request_fixed_s + prompt * lay.host.prompt_token_s
        headers = [s + float(r["headers_s"]) for s, r in zip(sent, rs, strict=True)]
        timer = Launching(loadsim.RooflineStep(m, lay), m, lay)
        out = lay.host.step_floor_s(1)  # the first token's way out, as request_fixed_s has it
        serial = prompt * lay.host.prompt_token_s
        got = [waves(replay(lim, timer, prompt, gen, sent, sent, way_in, serial), n)]
        held = sorted(float(r["ttft_s"]) - float(r["headers_s"]) for r in rs)[len(rs) // 2] < 1e-3
        got.append("— (head held to the first token)" if held else
                   waves(replay(lim, timer, prompt, gen, sent, headers, out, 0.0), n))
        print(f"| {rel.split('/')[1]} | {waves([float(r['ttft_s']) for r in rs], n)} | "
              f"{pred.ttft_p50_s:.3f} | " + " | ".join(got) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
