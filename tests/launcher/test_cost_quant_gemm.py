"""A 4-bit model's decode step: each mixed-input GEMM (Machete on the H200) pays a fixed cost
besides its weights' bytes, so a small layer's GEMMs stream further from the rate than a large
one's (costmodel.quant_gemm_fixed_s, hardware.QUANT_GEMM_FIXED_S)."""

from __future__ import annotations

import json

import pytest

from launcher.model import families
from launcher.planner import costmodel
from launcher.planner.cudagraphs import Requested
from tests.launcher.gpushapes import one_gpu, spec
from tests.launcher.paths import REPO

RESULTS = REPO / "benchmarks" / "gpu" / "results"
# every one-GPU H200 AWQ record: (shape, folder, the run's CUDA-graph range)
AWQ_RECORDS = [
    ("qwen2.5-32b-awq-shape", "2026-12-02-h200-table/awq", 64),
    ("qwen2.5-14b-awq-shape", "2026-12-02-h200-table3/awq14", 64),
    ("qwen2.5-14b-awq-shape", "2026-12-02-h200-table3/awq14-default", 512),
    ("llama-3.1-8b-awq-shape", "2026-12-03-h200-table4/awq8b", 64),
    ("llama-3.3-70b-awq-shape", "2026-12-03-h200-table5/awq70", 512),
]


def _gemm_s_per_byte(name: str) -> float:
    """The one-stream step's time per weight byte once its KV read and graph kernels are out."""
    m = spec(name)
    lay = one_gpu(m, Requested(512))
    gpus = [g for stage in lay.stages for g in stage]
    kernels = m.num_layers * families.decode_layer_kernels(m.family, moe=False)
    rest = (m.kv_bytes(640) / costmodel._mem_bytes_s(gpus)
            + kernels * costmodel.graph_kernel_s(gpus))
    return (costmodel.decode_step_s(m, lay, 1, 640) - rest) / costmodel.streamed_weight_bytes(m)


def test_a_4bit_models_small_layers_cost_more_a_byte_than_a_large_models() -> None:
    # the 8B's 114 MB layers against the 70B's 445 MB: the same four GEMMs' fixed cost
    # spread over four times the bytes (H200: 3.65 ms and 20.67 ms a step)
    assert _gemm_s_per_byte("llama-3.1-8b-awq-shape") > 1.1 * _gemm_s_per_byte(
        "llama-3.3-70b-awq-shape")


def test_a_bf16_models_step_pays_no_4bit_gemm_cost() -> None:
    assert costmodel.quant_gemm_fixed_s(spec("qwen2.5-14b-shape"), 48) == 0.0
    assert costmodel.quant_gemm_fixed_s(spec("qwen2.5-14b-awq-shape"), 48) > 0.0


@pytest.mark.parametrize(("name", "folder", "graphs"), AWQ_RECORDS)
def test_h200_awq_one_stream_decode_step_within_10_percent(
        name: str, folder: str, graphs: int) -> None:
    # the shipped H200 profile, as the records were planned (the 70B's table 5 was not fitted)
    summary = json.loads((RESULTS / folder / "single.json").read_text())["summary"]
    m = spec(name)
    planned = costmodel.decode_step_s(m, one_gpu(m, Requested(graphs)), 1, 512 + 128)
    assert planned == pytest.approx(summary["tpot_s"]["p50"], rel=0.10)
