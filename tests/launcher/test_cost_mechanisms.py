"""Kernel behaviour the cost model follows (launcher/planner/costmodel.py), each from how vLLM
0.26 runs the model: 4-bit weights through Marlin's pass, the fused-MoE op's dispatch beside the
GPU's arithmetic, and the DeepSeek family's extra eager work (launcher/model/families.py). The
H200 figures named are the records these were read from (benchmarks/gpu/results/): agreement,
not validation."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.model import families
from launcher.model.modelspec import ModelSpec
from launcher.planner import costmodel, hardware
from launcher.planner.costmodel import Layout
from launcher.planner.cudagraphs import EAGER
from launcher.planner.hardware import SERVER_HOST, HostProfile
from tests.launcher.gpushapes import one_gpu, spec

NO_HOST = HostProfile(0.0, 0.0, 0.0, 0.0, "none", layer_launch_s=0.0)


@pytest.fixture(scope="module")
def awq() -> tuple[ModelSpec, Layout]:
    m = spec("qwen2.5-32b-awq-shape")
    return m, one_gpu(m)


def test_a_4bit_models_32_stream_step_is_not_shorter_than_its_one_stream_step(
        awq: tuple[ModelSpec, Layout]) -> None:
    # Marlin loads and dequantizes every weight once per 64-row pass: 32 rows cost the pass,
    # and 31 more sequences only add their KV read (H200: 11.5 ms at one stream, 13.3 at 32)
    m, lay = awq
    one = costmodel.decode_step_s(m, lay, 1, 640)
    many = costmodel.decode_step_s(m, lay, 32, 640)
    kv_read = 31 * m.kv_bytes(640) / (4.04e12)
    assert many >= one
    assert many == pytest.approx(one + kv_read, rel=0.1)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 64))
def test_a_4bit_models_weights_cost_the_same_pass_at_every_batch_up_to_64(batch: int) -> None:
    m = spec("qwen2.5-32b-awq-shape")
    assert (costmodel.weight_stream_efficiency(m, batch)
            == costmodel.weight_stream_efficiency(m, 1) < 1.0)


def test_a_4bit_models_step_costs_more_than_its_weight_bytes_at_the_bf16_rate(
        awq: tuple[ModelSpec, Layout]) -> None:
    m, lay = awq
    bf16_rate_s = m.weight_bytes / 4.04e12  # the H200's measured bf16 GEMV rate
    assert costmodel.decode_step_s(m, lay, 32, 640) > 2 * bf16_rate_s


def test_a_4bit_prompt_chunk_reads_its_weights_through_the_same_pass(
        awq: tuple[ModelSpec, Layout]) -> None:
    # a short chunk's GEMMs are Marlin's too: bound by the pass, not by the bf16 rate
    m, lay = awq
    gpu_only = replace(lay, host=NO_HOST)
    pass_s = m.weight_bytes / (4.04e12 * costmodel.weight_stream_efficiency(m, 4))
    # within the CUDA-graph range (the records' 64 tokens) the pieces replay: no eager cost,
    # only the layers' elementwise kernels beside the GEMMs
    assert gpu_only.graphs.mode(4, 4) == "piecewise"
    elementwise = m.num_layers * costmodel.elementwise_layer_s(m, gpu_only, 4)
    weights_s = costmodel.prefill_step_s(m, gpu_only, 4) - hardware.STEP_OVERHEAD_S - elementwise
    assert weights_s == pytest.approx(pass_s, rel=0.05)
    # eager, as a chunk past the range runs: the same pass and each layer's eager cost
    eager = replace(gpu_only, graphs=EAGER)
    fixed = m.num_layers * hardware.EAGER_LAYER_S + hardware.STEP_OVERHEAD_S
    assert costmodel.prefill_step_s(m, eager, 4) - fixed == pytest.approx(pass_s, rel=0.05)


def test_an_moe_layers_fused_moe_dispatch_runs_beside_the_gpus_arithmetic() -> None:
    # Qwen3-30B-A3B shape on the H200: 2.0 ms a layer at 512 tokens and about as much in the
    # 8,192-token chunks of its 32-stream run; the dispatch hides the arithmetic, not adds to it
    m = spec("qwen3-30b-a3b-shape")
    lay = one_gpu(m)
    alone = costmodel.prefill_step_s(m, lay, 512)
    chunk = costmodel.prefill_step_s(m, lay, 8192, pairs=16 * costmodel.causal_pairs(512, 0),
                                     sequences=16)
    assert chunk < 1.15 * alone
    per_layer = (alone - 1e-3) / m.num_layers
    assert per_layer == pytest.approx(costmodel.eager_host_layer_s(m, lay.host), rel=0.01)


def test_a_deepseek_layer_launches_more_from_the_host_than_another_moe_layer() -> None:
    deepseek, qwen3 = spec("deepseek-v2-lite-shape"), spec("qwen3-30b-a3b-shape")
    assert families.eager_layer_host_extra_s(deepseek.family) > 0
    assert families.eager_layer_host_extra_s(qwen3.family) == 0
    assert (costmodel.eager_host_layer_s(deepseek, SERVER_HOST)
            > costmodel.eager_host_layer_s(qwen3, SERVER_HOST))



def test_a_router_with_a_score_bias_is_one_fused_kernel_not_deepseek_v2s_torch_ops() -> None:
    # DeepSeek-V3 (Moonlight) and GLM keep a score-correction bias (noaux_tc): vLLM runs one
    # fused top-k kernel where V2's softmax router dispatches a chain of torch ops, so their
    # eager layer launches less than V2's, and more than a Qwen3-MoE layer (the MLA path)
    v2, v3, glm = (spec(n) for n in ("deepseek-v2-lite-shape", "moonlight-16b-a3b-shape",
                                     "glm-4.7-flash-shape"))
    qwen3 = spec("qwen3-30b-a3b-shape")
    eager = [costmodel.eager_host_layer_s(m, SERVER_HOST) for m in (qwen3, v3, glm, v2)]
    assert eager[0] < eager[1] < eager[3]
    assert eager[1] == pytest.approx(eager[2])
    # within the graphs all three keep the same MLA prefill path
    assert len({costmodel.piecewise_host_layer_s(m, SERVER_HOST) for m in (v2, v3, glm)}) == 1


def test_within_the_graphs_an_mla_layer_keeps_only_its_attention_ops_host_work() -> None:
    # piecewise graphs replay the grouped router and the shared experts (inside compiled
    # pieces) but leave the MLA prefill path (inside the attention op) to Python: a GLM or
    # DeepSeek prompt layer within the range costs more host work than a Qwen3-MoE layer's
    # pieces, and less than its own eager layer's extra
    glm, qwen3 = spec("glm-4.7-flash-shape"), spec("qwen3-30b-a3b-shape")
    pw_glm = costmodel.piecewise_host_layer_s(glm, SERVER_HOST)
    pw_qwen3 = costmodel.piecewise_host_layer_s(qwen3, SERVER_HOST)
    eager_extra = families.eager_layer_host_extra_s(glm.family)
    assert pw_qwen3 == pytest.approx(SERVER_HOST.piecewise_layer_s)
    assert 0 < pw_glm - pw_qwen3 < eager_extra
    assert families.piecewise_layer_host_extra_s(spec("deepseek-v2-lite-shape").family) == (
        pytest.approx(pw_glm - pw_qwen3))
    # a slower host scales that part with the rest of its launching
    slow = replace(SERVER_HOST, layer_launch_s=2 * SERVER_HOST.layer_launch_s)
    assert costmodel.piecewise_host_layer_s(glm, slow) == pytest.approx(2 * pw_glm)


def test_a_slower_host_slows_every_part_of_an_eager_layers_launch() -> None:
    m = spec("deepseek-v2-lite-shape")
    slow = replace(SERVER_HOST, layer_launch_s=2 * SERVER_HOST.layer_launch_s)
    assert costmodel.eager_host_layer_s(m, slow) == pytest.approx(
        2 * costmodel.eager_host_layer_s(m, SERVER_HOST))
