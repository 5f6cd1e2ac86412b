"""The planner's latent-attention (MLA) arithmetic against vLLM on the lent H200: the
DeepSeek-V2-Lite shape (benchmarks/gpu/models/deepseek-v2-lite-shape, dummy weights) loaded by
vLLM 0.26 with its FLASH_ATTN_MLA backend. The test reads vLLM's own log lines from the run
(benchmarks/gpu/results/2026-12-01-h200-mla/, docs/benchmarks.md has the command)."""

from __future__ import annotations

import re

import pytest

from launcher.model.modelspec import GIB, load_model_spec
from launcher.planner import memfit
from tests.launcher.paths import REPO

LOG = REPO / "benchmarks" / "gpu" / "results" / "2026-12-01-h200-mla" / "vllm-llm-init.log"
SHAPE = REPO / "benchmarks" / "gpu" / "models" / "deepseek-v2-lite-shape"


def logged(pattern: str) -> float:
    found = re.search(pattern, LOG.read_text())
    assert found, f"{LOG.name} lacks {pattern!r}"
    return float(found.group(1).replace(",", ""))


def test_kv_tokens_vllm_gives_a_latent_cache_on_the_h200_are_the_planners() -> None:
    m = load_model_spec(str(SHAPE))
    kv_gib = logged(r"Available KV cache memory: ([\d.]+) GiB")
    vllm_tokens = logged(r"GPU KV cache size: ([\d,]+) tokens")
    planned = memfit.kv_pool_tokens(m, kv_gib * GIB, 4096, 8192, block=64)
    # vLLM prints the memory to 0.01 GiB: 0.013 % of 39.62 GiB
    assert planned == pytest.approx(vllm_tokens, rel=0.001)


def test_weights_vllm_loads_for_the_latent_shape_are_the_planners() -> None:
    m = load_model_spec(str(SHAPE))
    loaded = logged(r"Model loading took ([\d.]+) GiB")
    assert memfit.weights_per_gpu(m, 1, 1) / GIB == pytest.approx(loaded, rel=0.01)
