"""A long prompt's GPU work on a latent-attention mixture of experts (issue 22's fifth H200
table: the GLM-4.7-Flash shape's 16k prompt took 0.493 s to its first token where the plan said
0.61-0.66). Two GPU terms the roofline had wrong, each from vLLM's own kernels:

- MLA prefill attends in the decompressed form (q/k head dim nope + rope, v head dim
  v_head_dim: launcher.model.mla), not the absorbed latent form a decode step runs (576 + 576
  dims a pair and head for GLM, 2.25x its prefill's 256 + 256);
- vLLM's fused-MoE op runs its routed experts' grouped GEMMs well below the dense GEMM rate on
  a big chunk where it has no tuned tile config for the shape, as the H200 timed it
  (benchmarks/gpu/results/2026-12-02-h200-table3/kernels.tgz, the Moonlight-16B-A3B shape's
  "moe" op, graph-replayed)."""

from __future__ import annotations

import pytest

from launcher.planner import costmodel, hardware
from launcher.planner.costmodel import attention_work, causal_pairs
from launcher.planner.cudagraphs import VLLM_RULE
from tests.launcher.gpushapes import h200_kernel_times, one_gpu, spec

# the fifth table's GLM-4.7-Flash 16k prompt alone: median of 4 requests' first tokens, 0.492-
# 0.499 s (benchmarks/gpu/results/2026-12-03-h200-table5/mlalong/long16-c1.json, summary)
MEASURED_16K_TTFT_S = 0.4935


def measured_moe_s(tokens: int) -> float:
    """The H200's graph-replayed time of the Moonlight shape's fused-MoE op (routed experts)."""
    return float(next(r["seconds"] for r in h200_kernel_times("moonlight-16b-a3b-shape")
                      if r["op"] == "moe" and r["tokens"] == tokens))


def test_a_latent_attention_prompt_attends_in_the_decompressed_heads_dims() -> None:
    m = spec("glm-4.7-flash-shape")
    assert m.mla is not None
    work = attention_work(m, 8192)
    per_pair_head = m.mla.qk_head_dim + m.mla.v_head_dim  # 256 + 256 for GLM
    assert work.flops == pytest.approx(
        m.num_layers * 2.0 * m.num_heads * per_pair_head * causal_pairs(8192, 0))


def test_a_latent_attention_decode_token_keeps_the_absorbed_latent_dims() -> None:
    # one new token: vLLM's MLA runs it as a decode (multi-query over the cached latent)
    m = spec("glm-4.7-flash-shape")
    assert m.mla is not None
    latent = m.mla.latent_dim
    assert attention_work(m, 1, pairs=16384.0).flops == pytest.approx(
        m.num_layers * 2.0 * m.num_heads * 2 * latent * 16384)


def test_a_dense_models_attention_is_unchanged_by_the_latent_rule() -> None:
    m = spec("qwen3-8b-shape")
    assert attention_work(m, 8192).flops == pytest.approx(
        m.num_layers * 2.0 * m.num_heads * 2 * m.head_dim * causal_pairs(8192, 0))


def roofline_moe_op_s(tokens: int) -> float:
    """The planner's time of the Moonlight shape's routed experts in one layer: their GEMMs at
    the fused-MoE op's rate or every expert's weights read, whichever is longer."""
    m = spec("moonlight-16b-a3b-shape")
    lay = one_gpu(m)
    gpus = [g for stage in lay.stages for g in stage]
    layers = costmodel.moe_layers(m) - 1  # the first layer is dense (first_k_dense_replace)
    flops = (2.0 * costmodel.routed_expert_params(m) * tokens
             + costmodel.moe_gemm_excess_flops(m, lay, tokens)) / layers
    experts = costmodel.routed_expert_params(m) / m.experts_per_token * m.num_experts
    weights = experts * 2 / layers  # bf16
    return max(flops / costmodel._prefill_flops_s(gpus), weights / costmodel._mem_bytes_s(gpus))


@pytest.mark.parametrize("tokens", [4096, 8192])
def test_a_big_chunks_fused_moe_takes_what_the_h200_timed(tokens: int) -> None:
    # at the dense GEMM rate it was 1.23 ms against 2.19 at 8,192 tokens (-44%)
    assert roofline_moe_op_s(tokens) == pytest.approx(measured_moe_s(tokens), rel=0.1)


def test_a_tuned_fused_moe_shape_keeps_the_dense_rate() -> None:
    # vLLM ships an H200 config for Qwen3-30B-A3B's 128 experts of 768, none for Moonlight's or
    # GLM-4.7-Flash's 64 of 1,408 / 1,536 (launcher.planner.moetuned)
    qwen3 = spec("qwen3-30b-a3b-shape")
    assert costmodel.moe_gemm_efficiency(qwen3, one_gpu(qwen3)) == 1.0
    for name in ("moonlight-16b-a3b-shape", "glm-4.7-flash-shape"):
        m = spec(name)
        assert costmodel.moe_gemm_efficiency(m, one_gpu(m)) == hardware.MOE_GEMM_EFFICIENCY
    assert costmodel.moe_gemm_excess_flops(spec("qwen3-8b-shape"),
                                           one_gpu(spec("qwen3-8b-shape")), 8192) == 0.0


def test_a_small_chunks_fused_moe_is_its_experts_weights_read() -> None:
    # 512 tokens: every expert is read; the GEMMs' rate does not decide it
    assert roofline_moe_op_s(512) == pytest.approx(measured_moe_s(512), rel=0.2)
    assert hardware.MOE_GEMM_EFFICIENCY < 1.0


def test_a_16k_prompt_on_the_latent_moe_takes_what_the_fifth_table_measured() -> None:
    # 16,384 tokens in two 8,192-token chunks (past the default graph range: eager), the
    # second attending to the first; the record's median first token, less the request's
    # way in and out through the shipped host. Agreement with a record no constant here was
    # fitted to (before: 0.608 s, +23%)
    m = spec("glm-4.7-flash-shape")
    lay = one_gpu(m, VLLM_RULE)  # the fifth table served vLLM's default range
    planned = (costmodel.prefill_at_depth_s(m, lay, 16384)
               + costmodel.request_host_s(lay.host, 16384))
    assert planned == pytest.approx(MEASURED_16K_TTFT_S, rel=0.15)
