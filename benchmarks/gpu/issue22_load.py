"""Issue 22: the roofline's load figures through the simulated scheduler against every recorded
H200 run at more than one stream (loadgen's TTFT p50, TPOT p50, output tok/s), beside the closed
formula's throughput and the plan's one-request TTFT. Reads the result folders; prints a table.

    .venv/bin/python benchmarks/gpu/issue22_load.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launcher.model.modelspec import load_model_spec
from launcher.planner import loadsim
from launcher.planner.cudagraphs import Requested
from launcher.planner.layouts import Links, Shape, best_candidate
from launcher.planner.plantypes import Policy
from launcher.probe.topology import load_topology

# the runs' engines captured CUDA graphs up to 64 tokens (benchmarks/gpu/run_config.sh)
RUNS_GRAPHS = Requested(64)

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "gpu" / "results"
MODELS = REPO / "benchmarks" / "gpu" / "models"
TOPO = REPO / "tests" / "fixtures" / "topologies"
NVLINK = TOPO / "h200x2-nvlink.nvml.json"
SHM = TOPO / "h200x2-p2p-disabled.toposerve.json"

# (result file, model shape, topology, tp, pp, gpu_memory_utilization)
CASES = [
    ("2026-12-02-h200-table/small/c32.json", "llama-3.2-1b-shape", NVLINK, 1, 1, 0.9),
    ("2026-12-02-h200-table/qwen7b/c32.json", "qwen2.5-7b-shape", NVLINK, 1, 1, 0.9),
    ("2026-12-02-h200-table/mla/c32.json", "deepseek-v2-lite-shape", NVLINK, 1, 1, 0.9),
    ("2026-12-02-h200-table/awq/c32.json", "qwen2.5-32b-awq-shape", NVLINK, 1, 1, 0.9),
    ("2026-12-02-h200-table/gemma/c32.json", "gemma-3-27b-shape", NVLINK, 1, 1, 0.9),
    ("2026-12-02-h200-table/gemma/long16-c1.json", "gemma-3-27b-shape", NVLINK, 1, 1, 0.9),
    ("2026-12-02-h200-table/gemma/long16-c4.json", "gemma-3-27b-shape", NVLINK, 1, 1, 0.9),
    ("2026-12-02-h200-table/long8b/long16-c1.json", "llama-3.1-8b-longctx-shape", NVLINK, 1, 1,
     0.3),
    ("2026-12-02-h200-table/long8b/long16-c4.json", "llama-3.1-8b-longctx-shape", NVLINK, 1, 1,
     0.3),
    ("2026-12-01-h200-issue14/dense/c32.json", "llama-3.1-8b-longctx-shape", NVLINK, 1, 1, 0.9),
    ("2026-12-01-h200-issue14/moe/c32.json", "qwen3-30b-a3b-shape", NVLINK, 1, 1, 0.9),
    ("2026-11-30-h200x2-session2/qwen32-tp1/c32.json", "qwen2.5-32b-shape", NVLINK, 1, 1, 0.9),
    ("2026-11-30-h200x2-session2/qwen32-tp2/c32.json", "qwen2.5-32b-shape", NVLINK, 2, 1, 0.9),
    ("2026-11-30-h200x2-session2/tp2-nvlink/c32.json", "llama-3.3-70b-shape", NVLINK, 2, 1, 0.9),
    ("2026-11-30-h200x2-session2/tp2-nvlink/c8.json", "llama-3.3-70b-shape", NVLINK, 2, 1, 0.9),
    ("2026-11-30-h200x2-session2/tp2-nop2p/c32.json", "llama-3.3-70b-shape", SHM, 2, 1, 0.9),
    ("2026-11-30-h200x2-session2/tp2-nop2p/c8.json", "llama-3.3-70b-shape", SHM, 2, 1, 0.9),
    ("2026-11-30-h200x2-session2/pp2-nvlink/c32.json", "llama-3.3-70b-shape", NVLINK, 1, 2, 0.9),
    ("2026-11-30-h200x2-session2/pp2-nop2p/c32.json", "llama-3.3-70b-shape", SHM, 1, 2, 0.9),
]


def p50(s: dict[str, object], key: str) -> float | None:
    v = s.get(key)
    return float(v["p50"]) if isinstance(v, dict) else None  # type: ignore[arg-type]


def ms(s: float | None) -> float | None:
    return None if s is None else s * 1e3


def main() -> int:
    print("| case | streams | requests | TTFT p50 measured | one request (plan before) | "
          "simulated p50 | TPOT p50 measured | simulated | out tok/s measured | closed formula |"
          " simulated |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    errs: dict[str, list[float]] = {"closed": [], "sim": [], "ttft_sim": [], "ttft_one": []}
    long_errs: dict[str, list[float]] = {"closed": [], "sim": []}
    for rel, shape, topo_path, tp, pp, util in CASES:
        data = json.loads((RESULTS / rel).read_text())
        cfg, s = data["config"], data["summary"]
        m = load_model_spec(str(MODELS / shape))
        topo = load_topology(str(topo_path), {})
        pol = Policy(workload="throughput", concurrency=cfg["concurrency"], force_tp=tp,
                     force_pp=pp, force_dp=1, gpu_memory_utilization=util,
                     prompt_tokens=cfg["prompt"], gen_tokens=cfg["gen"])
        usable = [g for g in topo.gpus if not g.mig_enabled]
        cand, lay = best_candidate(m, pol, Links(topo, RUNS_GRAPHS), usable, Shape(tp, pp, 1))
        assert lay is not None
        assert cand.predicted is not None
        assert cand.fit is not None
        pred, why = loadsim.under_load(m, lay, cand.fit, cand.predicted, prompt=cfg["prompt"],
                                       gen=cfg["gen"], concurrency=cfg["concurrency"],
                                       max_num_seqs=pol.max_num_seqs)
        out = float(s["output_tok_s"])
        closed = cand.predicted.throughput_tok_s
        sim = pred.sim_throughput_tok_s if isinstance(pred, loadsim.SimulatedPrediction) else None

        def pct(x: float | None, ref: float | None) -> str:
            if x is None or ref is None:
                return "—"
            return f"{x:,.3f} ({(x / ref - 1) * 100:+.0f}%)" if x < 100 else \
                f"{x:,.0f} ({(x / ref - 1) * 100:+.0f}%)"

        ttft, tpot = p50(s, "ttft_s"), p50(s, "tpot_s")
        simp = pred if isinstance(pred, loadsim.SimulatedPrediction) else None
        name = rel.split("/", 1)[1].removesuffix(".json")
        print(f"| {name} (TP{tp} PP{pp}) | {cfg['concurrency']} | {cfg.get('requests')} | "
              f"{ttft:.3f} | {pct(cand.predicted.ttft_s, ttft)} | "
              f"{pct(simp.ttft_p50_s if simp else None, ttft)} | "
              f"{'—' if tpot is None else f'{tpot * 1e3:.1f} ms'} | "
              f"{pct(simp.tpot_p50_s * 1e3 if simp and tpot else None, ms(tpot))} | "
              f"{out:,.0f} | {pct(closed, out)} | {pct(sim, out)} |")
        if sim is not None:
            errs["closed"].append(abs(closed / out - 1))
            errs["sim"].append(abs(sim / out - 1))
            errs["ttft_one"].append(abs(cand.predicted.ttft_s / ttft - 1))
            assert simp is not None
            errs["ttft_sim"].append(abs(simp.ttft_p50_s / ttft - 1))
            if cfg["prompt"] >= 16384:
                long_errs["closed"].append(abs(closed / out - 1))
                long_errs["sim"].append(abs(sim / out - 1))
        if not simp:
            print("   ", why[0], file=sys.stderr)
    n = len(errs["sim"])
    print(f"\nthroughput, mean |error| over the {n} simulated cases: closed formula "
          f"{sum(errs['closed']) / n * 100:.1f}%, simulated {sum(errs['sim']) / n * 100:.1f}%")
    k = len(long_errs["sim"])
    short_c = (sum(errs["closed"]) - sum(long_errs["closed"])) / (n - k) * 100
    short_s = (sum(errs["sim"]) - sum(long_errs["sim"])) / (n - k) * 100
    print(f"  16k prompts ({k} runs): closed {sum(long_errs['closed']) / k * 100:.1f}%, simulated "
          f"{sum(long_errs['sim']) / k * 100:.1f}%; 512-token prompts ({n - k} runs): closed "
          f"{short_c:.1f}%, simulated {short_s:.1f}%")
    print(f"TTFT p50, mean |error|: one request (the plan before) "
          f"{sum(errs['ttft_one']) / n * 100:.1f}%, simulated "
          f"{sum(errs['ttft_sim']) / n * 100:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
