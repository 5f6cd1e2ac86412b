"""vLLM's CUDA-graph estimate in memfit (issue 22): taken from the KV budget only where vLLM
0.26's V1 model runner serves the model, and growing with the graphs the served engine captures.
The logged starts themselves are tests/launcher/test_kv_context.py's."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.model import families
from launcher.model.modelspec import GIB, ModelSpec, load_model_spec
from launcher.planner import memfit
from launcher.planner.cudagraphs import EAGER, CudaGraphs, default_sizes
from launcher.planner.searchmemo import SearchMemo
from launcher.probe.topology import load_topology
from tests.launcher.paths import H200, REPO

MODELS = REPO / "benchmarks" / "gpu" / "models"
BIG = memfit.EngineLimits(8192, 1024)  # vLLM's defaults on an H100 or H200


def spec(name: str) -> ModelSpec:
    return load_model_spec(str(MODELS / name))


@pytest.mark.parametrize(("name", "v1"), [
    ("qwen3-30b-a3b-shape", True),  # Qwen3MoeForCausalLM: logged on the V1 runner
    ("moonlight-16b-a3b-shape", True),  # DeepseekV3ForCausalLM
    ("glm-4.7-flash-shape", True),  # Glm4MoeLiteForCausalLM
    ("deepseek-v2-lite-shape", False),  # an MoE vLLM 0.26 lists for the V2 runner
    ("qwen2.5-1.5b-shape", False),  # dense: V2
])
def test_only_the_models_vllm_serves_on_its_v1_runner_have_their_graphs_profiled(
        name: str, v1: bool) -> None:
    assert memfit.graphs_profiled(spec(name)) is v1


def test_a_hybrid_or_attention_free_model_takes_the_v1_runner_unless_listed() -> None:
    assert families.vllm_v1_runner("NemotronHForCausalLM", moe=False, hybrid=True,
                                   attention_free=False)
    assert families.vllm_v1_runner("MambaForCausalLM", moe=False, hybrid=False,
                                   attention_free=True)
    assert not families.vllm_v1_runner("Qwen2MoeForCausalLM", moe=True, hybrid=False,
                                       attention_free=False)
    assert not families.vllm_v1_runner("LlamaForCausalLM", moe=False, hybrid=False,
                                       attention_free=False)


def test_full_graphs_stop_at_max_num_seqs_and_piecewise_ones_do_not() -> None:
    sizes = CudaGraphs(default_sizes(512))
    assert len(sizes.sizes) == 51  # as vLLM 0.26 logged: PIECEWISE=51 (largest=512)
    assert memfit.graph_count(sizes, BIG) == 102
    assert memfit.graph_count(sizes, memfit.EngineLimits(2048, 256)) == 51 + 35
    assert memfit.graph_count(EAGER, BIG) == 0


def test_the_estimate_grows_with_the_graphs_captured_and_is_nothing_without_graphs() -> None:
    m = spec("qwen3-30b-a3b-shape")
    default = memfit.cudagraph_bytes(m, 1, CudaGraphs(default_sizes(512)), BIG)
    small = memfit.cudagraph_bytes(m, 1, CudaGraphs((1, 2, 4, 8, 16, 32, 64)), BIG)
    assert default == pytest.approx(small * 101 / 13)  # the graphs less one: 101 and 13
    assert memfit.cudagraph_bytes(m, 1, EAGER, BIG) == 0.0
    # a latent-attention layer's graphs hold more than a GQA layer's
    glm = spec("glm-4.7-flash-shape")
    assert memfit.cudagraph_bytes(glm, 1, CudaGraphs(default_sizes(512)), BIG) > 2.5 * default


def test_the_estimate_divides_with_pipeline_stages() -> None:
    m = spec("qwen3-30b-a3b-shape")
    graphs = CudaGraphs(default_sizes(512))
    assert memfit.cudagraph_bytes(m, 2, graphs, BIG) == pytest.approx(
        memfit.cudagraph_bytes(m, 1, graphs, BIG) / 2)


def test_a_plan_with_fewer_graphs_leaves_an_moe_more_kv_and_a_dense_model_the_same() -> None:
    gpus = load_topology(str(H200), {}).gpus[:1]
    moe = spec("qwen3-30b-a3b-shape")
    few = CudaGraphs(default_sizes(64))
    assert (memfit.fit(moe, gpus, 1, 1, 0.5, graphs=few).kv_budget
            > memfit.fit(moe, gpus, 1, 1, 0.5).kv_budget + 0.5 * GIB)
    dense = spec("qwen2.5-1.5b-shape")
    assert (memfit.fit(dense, gpus, 1, 1, 0.5, graphs=few).kv_budget
            == memfit.fit(dense, gpus, 1, 1, 0.5).kv_budget)


def test_the_search_memo_keeps_fits_of_different_graphs_apart() -> None:
    gpus = load_topology(str(H200), {}).gpus[:1]
    m = spec("qwen3-30b-a3b-shape")
    memo = SearchMemo()
    default = memo.fit(m, gpus, 1, 1, 0.5, 2, 0.0)
    few = memo.fit(m, gpus, 1, 1, 0.5, 2, 0.0, CudaGraphs(default_sizes(64)))
    assert few.kv_budget > default.kv_budget


def test_the_latent_attention_profiling_chunk_sets_glms_peak_and_not_moonlights() -> None:
    # vLLM's MLA attention allocates a whole context chunk's up-projection in the profiling
    # pass: 64 Ki tokens × 20 heads × (192 + 256) dims for GLM-4.7-Flash, 1.09 GiB
    glm = spec("glm-4.7-flash-shape")
    assert memfit.mla_attention_peak(glm, 1, BIG) >= 1.09 * GIB + 0.2 * GIB
    assert memfit.activation_bytes(glm, 1, BIG) == pytest.approx(
        memfit.mla_attention_peak(glm, 1, BIG) + memfit.ACTIVATION_FIXED_BYTES)
    moon = spec("moonlight-16b-a3b-shape")
    assert memfit.mla_attention_peak(moon, 1, BIG) + memfit.ACTIVATION_FIXED_BYTES \
        < memfit.activation_bytes(moon, 1, BIG)
    # the chunk is eight requests of the context or four pages of each of max_num_seqs: a
    # short-context model's is smaller where max_num_seqs is vLLM's 256 (cards under 70 GiB)
    small = memfit.EngineLimits(2048, 256)
    short = dataclasses.replace(glm, max_position_embeddings=4096)
    assert memfit.mla_attention_peak(short, 1, small) < memfit.mla_attention_peak(glm, 1, small)
