"""The memory fit: vLLM's defaults by card, its start-up KV check, the margin kept."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.model.modelspec import GIB, load_model_spec
from launcher.planner import memfit
from tests.launcher.paths import MODELS, REPO, model


def test_vllm_defaults_follow_the_card() -> None:
    assert memfit.vllm_defaults(int(140.4 * GIB), "NVIDIA H200") == memfit.EngineLimits(8192, 1024)
    assert memfit.vllm_defaults(80 * GIB, "NVIDIA A100-SXM4-80GB").batched_tokens == 2048
    assert memfit.vllm_defaults(24 * GIB, "NVIDIA GeForce RTX 4090").batched_tokens == 2048
    assert memfit.vllm_defaults(180 * GIB, "NVIDIA B200").batched_tokens == 16384


def test_sliding_layers_are_padded_into_groups_as_vllm_does() -> None:
    m = load_model_spec(model("gemma-3-27b"))
    counted = {g.window: n for g, n in memfit.vllm_groups(m)}
    assert counted == {None: 10, 1024: 60}  # 52 sliding layers counted as 6 groups of 10


def test_vllm_forms_a_kv_group_per_padded_run_of_layers() -> None:
    # the block tables the engine keeps per request (hardware.HostProfile.kv_group_seq_step_s)
    counts = {name: memfit.vllm_group_count(load_model_spec(model(name)))
              for name in ("gemma-3-27b", "llama-3.3-70b")}
    assert counts == {"gemma-3-27b": 7, "llama-3.3-70b": 1}  # 60 sliding / 10 + 10 full / 10


# every model the tests and the GPU benchmark hold, and how many KV groups vLLM forms for those
# of more than one (memfit.vllm_group_count; all others: 1)
EVERY_MODEL = sorted([*MODELS.iterdir(), *(REPO / "benchmarks" / "gpu" / "models").glob("*-shape")])
MORE_THAN_ONE_GROUP = {
    "gemma-2-27b": 2, "gemma-3-27b": 7, "gemma-4-26b-a4b": 2, "gemma-4-31b": 2, "gpt-oss-20b": 2,
    "gemma-2-9b-shape": 2, "gemma-3-12b-shape": 6, "gemma-3-1b-shape": 7,
    "gemma-3-270m-shape": 6, "gemma-3-27b-shape": 7, "gemma-3-4b-shape": 7,
}


@pytest.mark.parametrize("path", EVERY_MODEL, ids=[p.name for p in EVERY_MODEL])
def test_the_kv_group_count_is_the_groups_padded_layers_over_a_groups_size(path: Path) -> None:
    m = load_model_spec(str(path))
    count, groups = memfit.vllm_group_count(m), memfit.vllm_groups(m)
    assert count == MORE_THAN_ONE_GROUP.get(path.name, 1)
    padded = [n for _, n in groups]
    size = min(padded)
    if count != max(1, len(groups)):  # one page size: every type padded to whole groups
        assert all(n % size == 0 for n in padded)
        assert count == sum(padded) // size
    else:  # a type is a group (types of different pages), or padding made each type one
        assert all(n == size for n in padded) or len({g.bytes_per_token() for g, _ in groups}) > 1


def test_a_dense_model_needs_whole_blocks_of_every_layer() -> None:
    m = load_model_spec(model("llama-3.3-70b"))
    per_block = 16 * m.kv_bytes_per_layer_token() * 80
    assert memfit.request_kv_bytes(m, 1000, 8192) == 63 * per_block  # ceil(1000 / 16)


@given(budget_gib=st.floats(0.01, 200), batched=st.sampled_from([512, 2048, 8192, 16384]),
       cushion_gib=st.one_of(st.floats(0, 4), st.just(math.inf)))
def test_the_planned_context_always_passes_vllms_check_with_the_margin(
    budget_gib: float, batched: int, cushion_gib: float
) -> None:
    cushion = cushion_gib * GIB
    for name in ("gemma-3-27b", "llama-3.3-70b", "gemma-4-31b", "qwen3-30b-a3b"):
        m = load_model_spec(model(name))
        ctx = memfit.planned_context(m, budget_gib * GIB, batched, cushion=cushion)
        assert 0 <= ctx <= m.max_position_embeddings
        null = memfit.null_block_bytes(m)  # the pool block vLLM holds back before its check
        if ctx:
            need = memfit.request_kv_bytes(m, ctx, batched) + null
            assert need <= memfit.usable_kv(budget_gib * GIB, cushion)
            assert need <= budget_gib * GIB - min(budget_gib * GIB * 0.02, cushion)
        if ctx < m.max_position_embeddings:  # the longest: one token more would not pass
            assert memfit.request_kv_bytes(m, ctx + 1, batched) + null > budget_gib * GIB * 0.95


@given(kv_gib=st.floats(0, 500), cushion_gib=st.one_of(st.floats(0, 8), st.just(math.inf)))
def test_the_margin_is_the_fraction_never_more_than_the_cushion_and_its_budget_inverts_it(
    kv_gib: float, cushion_gib: float
) -> None:
    kv, cushion = kv_gib * GIB, cushion_gib * GIB
    kept = memfit.kept_back(kv, cushion)
    assert kept <= memfit.CONTEXT_MARGIN * kv
    assert kept <= cushion
    assert kept in (pytest.approx(memfit.CONTEXT_MARGIN * kv), cushion)
    # need_per_gpu's budget is the smallest whose usable part holds the bytes asked
    budget = memfit.budget_holding(kv, cushion)
    assert memfit.usable_kv(budget, cushion) == pytest.approx(kv, abs=1.0)


def test_the_margin_is_the_estimates_absolute_terms_at_a_large_budget() -> None:
    # the Llama-3.1-8B shape at 0.9 on the H200: 2% of its 111 GiB of KV is 2.2 GiB, above the
    # 1.3 GiB of activation, CUDA-graph and non-torch bytes the estimate holds besides weights
    m = load_model_spec(str(REPO / "benchmarks/gpu/models/llama-3.1-8b-longctx-shape"))
    lim = memfit.vllm_defaults(int(140.4 * GIB), "NVIDIA H200")
    cushion = memfit.context_cushion(memfit.overhead_per_gpu(m, 1, 1, lim),
                                     memfit.kv_shards(m, 1, 1))
    kv = 111 * GIB
    assert memfit.kept_back(kv, cushion) == cushion < memfit.CONTEXT_MARGIN * kv
    assert memfit.kept_back(13 * GIB, cushion) == pytest.approx(memfit.CONTEXT_MARGIN * 13 * GIB)


def test_the_overhead_grows_with_vllms_profiling_batch() -> None:
    m = load_model_spec(model("llama-3.3-70b"))
    small = memfit.overhead_per_gpu(m, 1, 1, memfit.EngineLimits(2048, 256))
    big = memfit.overhead_per_gpu(m, 1, 1, memfit.EngineLimits(16384, 1024))
    assert big > small
    assert memfit.overhead_per_gpu(m, 2, 1, memfit.EngineLimits(2048, 256)) != pytest.approx(small)
