"""The planned context against vLLM's own KV-cache accounting on the H200 (issue 22: the planned
context starts every time and is within 5% of the longest one vLLM accepts).

The cases are vLLM 0.26's log lines, copied into tests/fixtures/vllm-kv-accounting.txt with the
run each came from. vLLM's longest context is what its "Available KV cache memory" holds by its
own block accounting (memfit.longest_context reproduces its "GPU KV cache size" to 0.03%), capped
by the model's own limit; "uncapped" lifts that cap, so that the cases whose context the model
caps still test the memory terms.

Print the table (docs/planner.md): .venv/bin/python -m tests.launcher.test_kv_context
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import pytest

from launcher.model.modelspec import GIB, ModelSpec, load_model_spec
from launcher.planner import memfit
from launcher.planner.cudagraphs import CudaGraphs
from launcher.probe.topology import load_topology
from tests.launcher.paths import H200, REPO

FIXTURE = REPO / "tests" / "fixtures" / "vllm-kv-accounting.txt"
MODELS = REPO / "benchmarks" / "gpu" / "models"
WITHIN = 0.05
ROUNDING = 0.005 * GIB  # vLLM prints GiB to two decimals
HEAD = re.compile(r"== (\S+) (\S+) util=([0-9.]+) tp=(\d) pp=(\d)(?: graphs=([0-9,]+))?")
GIB_FIGURE = re.compile(r"([0-9.]+) GiB for (weight|peak activation|non-torch memory)")


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    util: float
    tp: int
    pp: int
    available: float  # bytes, one GPU
    pool_tokens: int
    usage: dict[str, float]  # vLLM's "Actual usage" terms, bytes, where logged
    graphs: CudaGraphs | None  # the capture sizes the run set (None: vLLM's default)
    graph_estimate: float | None  # vLLM's "Estimated CUDA graph memory", bytes, where logged


def cases() -> list[Case]:
    out: list[Case] = []
    for block in FIXTURE.read_text().split("\n== ")[1:]:
        lines = ("== " + block).splitlines()
        head = HEAD.fullmatch(lines[0])
        assert head, lines[0]
        text = "\n".join(lines[1:])
        avail = re.search(r"Available KV cache memory: ([0-9.]+) GiB", text)
        pool = re.search(r"GPU KV cache size: ([0-9,]+) tokens", text)
        assert avail, lines[0]
        assert pool, lines[0]
        usage = {k: float(v) * GIB for v, k in GIB_FIGURE.findall(text)}
        sizes = head[6] and CudaGraphs(tuple(int(n) for n in head[6].split(",")))
        estimate = re.search(r"Estimated CUDA graph memory: ([0-9.]+) GiB", text)
        out.append(Case(head[1], head[2], float(head[3]), int(head[4]), int(head[5]),
                        float(avail[1]) * GIB, int(pool[1].replace(",", "")), usage,
                        sizes or None, float(estimate[1]) * GIB if estimate else None))
    return out


def uncapped(m: ModelSpec) -> ModelSpec:
    return dataclasses.replace(m, max_position_embeddings=1 << 26,
                               rope_cache_elems=memfit.rope_cache_bytes(m) // 2)


@dataclass(frozen=True)
class Row:
    planned: int
    accepted: int
    planned_uncapped: int
    accepted_uncapped: int
    kv_estimate: float  # bytes, one GPU
    fit: memfit.Fit


def graphs(c: Case, f: memfit.Fit) -> CudaGraphs:
    """The CUDA graphs the run captured: its own sizes, else vLLM's default on its GPUs."""
    gpus = load_topology(str(H200), {}).gpus[: c.tp * c.pp]
    return c.graphs or memfit.default_graphs(gpus, f.limits)


def row(c: Case) -> Row:
    m = load_model_spec(str(MODELS / c.model))
    gpus = load_topology(str(H200), {}).gpus[: c.tp * c.pp]
    f = memfit.fit(m, gpus, c.tp, c.pp, c.util, graphs=c.graphs)
    shards = memfit.kv_shards(m, c.tp, c.pp)
    batched = f.limits.batched_tokens
    big = uncapped(m)
    return Row(
        planned=f.context,
        accepted=memfit.longest_context(m, c.available * shards, batched),
        planned_uncapped=memfit.planned_context(big, f.kv_budget, batched, cushion=f.cushion),
        accepted_uncapped=memfit.longest_context(big, c.available * shards, batched),
        kv_estimate=f.kv_budget / shards,
        fit=f,
    )


CASES = cases()
# The logged starts where memfit's KV estimate is above vLLM's, with why. memfit counts vLLM
# 0.26's CUDA-graph estimate where vLLM takes it (its V1 runner: these MoEs) and the latent
# attention's profiling chunk (GLM-4.7-Flash), which put every planned context below vLLM's;
# what is left: the latent-attention MoEs' profiling peak is still above memfit's (GLM 1.63 GiB
# for 1.54; Moonlight 1.09 for 0.94, its MoE path's), and Moonlight's estimate under graphs to
# 64 tokens is 0.014 GiB below vLLM's 0.15. (The AWQ 70B's estimate was 0.61 GiB above until
# its weights counted vLLM's repacking for Machete: quantization.awq_load_growth,
# test_awq_loaded_bytes.py.) The margin (memfit.kept_back, 2% here) keeps each plan below vLLM's.
PEAK = "its peak activation {} GiB, memfit's {}"
ABOVE = {
    "glm-0.6": PEAK.format(1.63, 1.54) + ": the estimate 0.14 GiB above vLLM's",
    "glm-0.6-g64": PEAK.format(1.63, 1.54) + ": the estimate 0.14 GiB above vLLM's",
    "moonlight-0.3": PEAK.format(1.09, 0.94) + ": the estimate 0.02 GiB above vLLM's",
    "moonlight-0.3-g64": PEAK.format(1.09, 0.94) + ", vLLM's graph estimate 0.15 GiB, memfit's "
                         "0.14: the estimate 0.22 GiB above vLLM's",
}


def params(failing: dict[str, str]) -> list[Any]:
    """Every case, those in ``failing`` a strict xfail with its reason."""
    return [pytest.param(c, id=c.name, marks=[pytest.mark.xfail(strict=True,
                                                                reason=failing[c.name])]
                         if c.name in failing else []) for c in CASES]


def test_the_fixture_holds_every_logged_family_and_utilisation() -> None:
    assert {c.util for c in CASES} >= {0.15, 0.2, 0.5, 0.9}
    assert {(c.tp, c.pp) for c in CASES} == {(1, 1), (2, 1), (1, 2)}
    assert {"qwen3-30b-a3b-shape", "gemma-3-27b-shape"} <= {c.model for c in CASES}


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_block_accounting_reproduces_vllms_logged_kv_tokens(c: Case) -> None:
    m = load_model_spec(str(MODELS / c.model))
    if len(memfit.vllm_groups(m)) == 1:  # one group: the pool is whole blocks of every layer
        r = row(c)
        assert r.accepted_uncapped == pytest.approx(c.pool_tokens, rel=0.001)


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_planned_context_is_within_5_percent_below_what_vllm_accepts(c: Case) -> None:
    r = row(c)
    for planned, accepted in ((r.planned, r.accepted),
                              (r.planned_uncapped, r.accepted_uncapped)):
        assert planned <= accepted, f"{c.name}: planned {planned:,} > vLLM's {accepted:,}"
        assert planned >= accepted * (1 - WITHIN), (
            f"{c.name}: planned {planned:,} is {1 - planned / accepted:.1%} below {accepted:,}")


@pytest.mark.parametrize("c", params(ABOVE))
def test_kv_estimate_stays_below_vllms_and_each_overhead_term_above_its_log(c: Case) -> None:
    # the terms vLLM subtracts besides the weights are each at least what it logged; the weights
    # (launcher/model) within 0.2 GiB: Gemma 3's 48.01 GiB against vLLM's 48.16 is not explained,
    # and the overhead terms' own surplus covers it (its KV estimate stays below vLLM's)
    r = row(c)
    assert r.kv_estimate <= c.available + ROUNDING
    m = load_model_spec(str(MODELS / c.model))
    lim = r.fit.limits
    if "peak activation" in c.usage:
        assert memfit.activation_bytes(m, c.tp, lim, c.pp) >= c.usage["peak activation"] - ROUNDING
        non_torch = r.fit.overhead - memfit.activation_bytes(m, c.tp, lim, c.pp) \
            - memfit.cudagraph_bytes(m, c.pp, graphs(c, r.fit), lim)
        assert non_torch >= c.usage["non-torch memory"] - ROUNDING
    if "weight" in c.usage:
        tp_buffers = memfit.TP_BUFFER_BYTES if c.tp > 1 else 0.0
        assert r.fit.weights + tp_buffers >= c.usage["weight"] - 0.2 * GIB


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_cuda_graph_estimate_is_counted_where_vllm_took_one_from_the_budget(c: Case) -> None:
    # vLLM 0.26 logs "Estimated CUDA graph memory" only where its V1 runner profiles the graphs
    # and takes the estimate from the KV budget (families.vllm_v1_runner)
    m = load_model_spec(str(MODELS / c.model))
    assert memfit.graphs_profiled(m) == (c.graph_estimate is not None)


@pytest.mark.parametrize("c", [c for c in CASES if c.graph_estimate is not None],
                         ids=[c.name for c in CASES if c.graph_estimate is not None])
def test_cuda_graph_estimate_is_vllms_to_within_0_2_gib_and_not_below_it_by_default(
        c: Case) -> None:
    # at or above vLLM's under its default sizes (the plans' graphs), which take the most
    assert c.graph_estimate is not None
    m = load_model_spec(str(MODELS / c.model))
    r = row(c)
    estimate = memfit.cudagraph_bytes(m, c.pp, graphs(c, r.fit), r.fit.limits)
    assert abs(estimate - c.graph_estimate) <= 0.2 * GIB
    if c.graphs is None:
        assert estimate >= c.graph_estimate - ROUNDING


def table() -> str:
    lines = ["| case | util | TP×PP | planned | vLLM accepts | planned (uncapped) | "
             "vLLM (uncapped) | KV estimate / vLLM's |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for c in CASES:
        r = row(c)
        lines.append(
            f"| {c.name} | {c.util} | {c.tp}×{c.pp} | {r.planned:,} | {r.accepted:,} | "
            f"{r.planned_uncapped:,} ({r.planned_uncapped / r.accepted_uncapped - 1:+.1%}) | "
            f"{r.accepted_uncapped:,} | {r.kv_estimate / GIB:.2f} / {c.available / GIB:.2f} GiB |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
