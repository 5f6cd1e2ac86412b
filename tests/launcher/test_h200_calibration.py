"""The planner against what toposerve measured on the lent 2 x H200 (issue 7's bar: prefill,
decode and aggregate throughput within 25%, and the interactive choice is the measured best).

The measurements are the loadgen files `benchmarks/gpu/run_config.sh` brought back
(docs/benchmarks.md has the commands); this test reads them, it does not restate them.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from launcher.model.modelspec import GIB, ModelSpec, load_model_spec
from launcher.planner import memfit
from launcher.planner.cudagraphs import CudaGraphs
from launcher.planner.plan import Plan, Policy, plan
from launcher.probe.topology import Topology, load_topology
from tests.launcher.gpushapes import RECORDS_GRAPHS
from tests.launcher.paths import H200, REPO, TOPOLOGIES

RESULTS = REPO / "benchmarks" / "gpu" / "results" / "2026-11-30-h200x2-session2"
MODELS = REPO / "benchmarks" / "gpu" / "models"
TOLERANCE = 0.25
# These runs used loadgen's old fixed seed, so the 3,584-token prompts began with the 512-token
# prompts of the single-stream runs before them: vLLM served those 512 tokens from its prefix
# cache (its log shows the hits), and only 3,072 were computed. The prediction is made for
# what was computed. (The c32 runs that followed a c8 run had 20 of 64 prompts cached too; the
# prediction holds for them regardless, and docs/benchmarks.md marks them.)
CACHED_PREFIX = {"long": 512}

# config folder -> (model shape, topology, tp, pp)
CONFIGS = {
    "tp2-nvlink": ("llama-3.3-70b-shape", "nvlink", 2, 1),
    "pp2-nvlink": ("llama-3.3-70b-shape", "nvlink", 1, 2),
    "tp2-nop2p": ("llama-3.3-70b-shape", "shm", 2, 1),
    "pp2-nop2p": ("llama-3.3-70b-shape", "shm", 1, 2),
    "qwen32-tp1": ("qwen2.5-32b-shape", "nvlink", 1, 1),
    "qwen32-tp2": ("qwen2.5-32b-shape", "nvlink", 2, 1),
}


def topology(kind: str) -> Topology:
    # the NVML dump of the machine itself; for the P2P-disabled runs, what `probe --measure`
    # recorded there with NCCL_P2P_DISABLE=1 (NCCL then used SHM, as the runs' logs show)
    if kind == "nvlink":
        return load_topology(str(H200), {})
    return load_topology(str(TOPOLOGIES / "h200x2-p2p-disabled.toposerve.json"), {})


def spec(name: str) -> ModelSpec:
    return load_model_spec(str(MODELS / name))


def printed_p50(table: str, row: str) -> float:
    """The p50 column of one row of loadgen's first printed table (mean, p50, p90, p99)."""
    line = next(x for x in table.splitlines() if x.strip("│ ").startswith(row))
    cells = [c.strip().replace(",", "") for c in line.split("│") if c.strip()]
    return float(cells[2])


def measured(config: str, scenario: str) -> dict[str, Any] | None:
    path = RESULTS / config / f"{scenario}.json"
    if path.exists():
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    if scenario == "single" and (RESULTS / config / "loadgen.txt").exists():
        # tp2-nvlink's single.json did not come back from the device (8 files per command);
        # loadgen printed the same run's table, which is kept.
        text = (RESULTS / config / "loadgen.txt").read_text()
        first = text.split("concurrency 1:")[0]
        return {
            "config": {"prompt": 512, "gen": 256, "concurrency": 1},
            "summary": {
                "prefill_tok_s": {"p50": printed_p50(first, "prefill tok/s")},
                "decode_tok_s": {"p50": printed_p50(first, "decode tok/s")},
            },
        }
    return None


def cases() -> list[tuple[str, str, str]]:
    out = []
    for config in CONFIGS:
        for scenario, figures in (
            ("single", ("prefill", "decode")),
            ("long", ("prefill",)),
            ("c8", ("throughput",)),
            ("c32", ("throughput",)),
        ):
            if measured(config, scenario) is not None:
                out.extend((config, scenario, f) for f in figures)
    return out


def test_every_gpu_configuration_was_measured() -> None:
    assert all((RESULTS / c).is_dir() for c in CONFIGS)
    assert len(cases()) >= 20


@pytest.mark.parametrize(("config", "scenario", "figure"), cases())
def test_prediction_within_25_percent_of_the_h200_measurement(
    config: str, scenario: str, figure: str
) -> None:
    model, kind, tp, pp = CONFIGS[config]
    run = measured(config, scenario)
    assert run is not None
    c, s = run["config"], run["summary"]
    new_tokens = c["prompt"] - CACHED_PREFIX.get(scenario, 0)
    policy = Policy(
        force_tp=tp,
        force_pp=pp,
        force_dp=1,
        prompt_tokens=new_tokens,
        gen_tokens=c["gen"],
        concurrency=c["concurrency"],
        graph_tokens=RECORDS_GRAPHS.tokens,  # the runs' CUDA graphs: to 64 tokens
    )
    chosen = plan(topology(kind), spec(model), policy)
    assert (chosen.tp, chosen.pp, chosen.dp) == (tp, pp, 1)
    p = chosen.predicted
    predicted, actual = {
        # prefill rate of the tokens computed: loadgen's figure counts the cached ones too
        "prefill": (p.prefill_tok_s, s["prefill_tok_s"]["p50"] * new_tokens / c["prompt"]),
        "decode": (p.decode_tok_s, s["decode_tok_s"]["p50"]),
        "throughput": (p.throughput_tok_s, s.get("output_tok_s")),
    }[figure]
    assert actual, f"{config}/{scenario} has no {figure} figure"
    assert abs(predicted / actual - 1) <= TOLERANCE, (
        f"{config} {scenario} {figure}: predicted {predicted:,.1f}, measured {actual:,.1f}"
    )


def test_interactive_choice_is_the_measured_best_on_the_h200() -> None:
    # interactive ranks by single-stream decode, then prefill; measured over NVLink
    runs = {c: measured(c, "single") for c in ("tp2-nvlink", "pp2-nvlink")}
    best = max(runs, key=lambda c: runs[c]["summary"]["decode_tok_s"]["p50"])  # type: ignore[index]
    chosen = plan(topology("nvlink"), spec("llama-3.3-70b-shape"), Policy())
    assert (chosen.tp, chosen.pp) == CONFIGS[best][2:]


def test_one_gpu_against_two_for_the_32b_shape_keeps_the_measured_order() -> None:
    one, two = measured("qwen32-tp1", "single"), measured("qwen32-tp2", "single")
    assert one is not None
    assert two is not None
    one_gpu = Policy(force_tp=1, force_pp=1, force_dp=1)
    p1 = plan(topology("nvlink"), spec("qwen2.5-32b-shape"), one_gpu).predicted
    p2 = plan(topology("nvlink"), spec("qwen2.5-32b-shape"), Policy(force_tp=2)).predicted
    measured_gain = two["summary"]["decode_tok_s"]["p50"] / one["summary"]["decode_tok_s"]["p50"]
    predicted_gain = p2.decode_tok_s / p1.decode_tok_s
    assert measured_gain > 1
    assert predicted_gain > 1
    assert predicted_gain == pytest.approx(measured_gain, rel=TOLERANCE)


def test_the_printed_table_parser_reads_the_p50_column() -> None:
    table = "│ prefill tok/s        │     5,679.4 │     6,624.3 │     6,743.3 │     6,770.1 │"
    assert printed_p50(table, "prefill tok/s") == 6624.3


# ------------------------------------------------- issue 14: families the model was not fitted to

ISSUE14 = REPO / "benchmarks" / "gpu" / "results" / "2026-12-01-h200-issue14"
BAR = 0.15  # issue 14's bar for prefill, decode and 32-stream throughput
# folder -> (model shape, --gpu-memory-utilization it was started with)
RUNS14 = {
    "dense": ("llama-3.1-8b-longctx-shape", 0.9),
    "moe": ("qwen3-30b-a3b-shape", 0.44),
    "ctx02": ("llama-3.1-8b-longctx-shape", 0.2),
    "ctx05": ("llama-3.1-8b-longctx-shape", 0.5),
    "sliding-0.9-start": ("gemma-3-27b-shape", 0.9),
}


def vllm_log(folder: str) -> str:
    return "\n".join(p.read_text() for p in sorted((ISSUE14 / folder / "logs").glob("vllm-*.log")))


def logged_gib(folder: str, pattern: str) -> float:
    match = re.search(pattern + r" ([0-9.]+) GiB", vllm_log(folder))
    assert match, f"{folder}: no '{pattern}' line in vLLM's log"
    return float(match.group(1))


def one_h200_plan(model: str, util: float, concurrency: int = 1) -> Plan:
    policy = Policy(
        force_tp=1, force_pp=1, force_dp=1, gpu_memory_utilization=util, concurrency=concurrency,
        graph_tokens=RECORDS_GRAPHS.tokens,  # the runs' CUDA graphs: to 64 tokens
    )
    return plan(topology("nvlink"), spec(model), policy)


@pytest.mark.parametrize(
    ("folder", "scenario", "figure"),
    [
        (f, s, x)
        for f in ("dense", "moe")
        for s, x in (("single", "prefill"), ("single", "decode"), ("c32", "throughput"))
    ],
)
def test_unfitted_families_within_15_percent_on_one_h200(
    folder: str, scenario: str, figure: str
) -> None:
    # Prefill of these two was FITTED to these runs (hardware.EAGER_HOST_LAYER_S and
    # MOE_LAYER_PREFILL_S); decode and 32-stream throughput were predicted before the run.
    model, util = RUNS14[folder]
    run = json.loads((ISSUE14 / folder / f"{scenario}.json").read_text())
    p = one_h200_plan(model, util, run["config"]["concurrency"]).predicted
    s = run["summary"]
    predicted, actual = {
        "prefill": (p.prefill_tok_s, s["prefill_tok_s"]["p50"]),
        "decode": (p.decode_tok_s, s["decode_tok_s"]["p50"]),
        "throughput": (p.throughput_tok_s, s["output_tok_s"]),
    }[figure]
    assert abs(predicted / actual - 1) <= BAR, f"{folder} {figure}: {predicted:.1f} vs {actual:.1f}"


@pytest.mark.parametrize("folder", sorted(RUNS14))
def test_planned_context_started_and_the_kv_estimate_is_vllms(folder: str) -> None:
    model, util = RUNS14[folder]
    p = one_h200_plan(model, util)
    m = spec(model)
    log = vllm_log(folder)
    # The run started the context planned by the tree of that day (commit c2ae9d2). vLLM starts
    # any context whose blocks its pool holds ("KV cache size", these models' single KV group),
    # so what the planner plans now (issue 22: closer to vLLM's own accounting) is held to that.
    started = int(re.search(r"max_seq_len=([0-9]+),", log).group(1))  # type: ignore[union-attr]
    tokens = int(re.search(r"KV cache size: ([0-9,]+) tokens", log).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert p.max_model_len <= max(tokens, started)
    assert started <= tokens or started == m.max_position_embeddings
    available = logged_gib(folder, "Available KV cache memory:")
    # the CUDA graphs the run captured (its compilation_config's sizes: graphs to 64 tokens):
    # vLLM takes their estimate from an MoE's KV budget (memfit.cudagraph_bytes)
    sizes = re.search(r"'cudagraph_capture_sizes': \[([0-9, ]+)\]", log)
    graphs = CudaGraphs(tuple(int(n) for n in sizes.group(1).split(","))) if sizes else None
    f = memfit.fit(m, topology("nvlink").gpus[:1], 1, 1, util, graphs=graphs)
    assert f.kv_budget / GIB == pytest.approx(available, rel=0.05)
    assert f.weights / GIB == pytest.approx(logged_gib(folder, "Model loading took"), rel=0.03)


def test_gemma3_refusal_is_reproduced_exactly() -> None:
    # Gemma 3 27B shape at 0.48 beside another engine: vLLM had 16.48 GiB for KV, needed 17.98
    # for 131,072 tokens and named 111,456 as the longest it could hold (its log, kept here).
    log = vllm_log("sliding-refused")
    assert "(17.98 GiB KV cache is needed" in log
    assert "the estimated maximum model length is 111456" in log
    m = spec("gemma-3-27b-shape")
    assert memfit.request_kv_bytes(m, 131072, 8192) / GIB == pytest.approx(17.98, abs=0.005)
    assert memfit.longest_context(m, 16.48 * GIB, 8192) == pytest.approx(111456, rel=0.001)
