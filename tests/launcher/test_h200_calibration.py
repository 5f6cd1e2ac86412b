"""The planner against what toposerve measured on the lent 2 x H200 (issue 7's bar: prefill,
decode and aggregate throughput within 25%, and the interactive choice is the measured best).

The measurements are the loadgen files `benchmarks/gpu/run_config.sh` brought back
(docs/benchmarks.md has the commands); this test reads them, it does not restate them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from launcher.modelspec import ModelSpec, load_model_spec
from launcher.plan import Policy, plan
from launcher.topology import Topology, load_topology
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
