"""A decoder layer's elementwise kernels (two fused residual-add + RMSNorms, the rotary embedding,
SiLU-and-mul) cost a prompt step's GPU time within the CUDA graphs too, as the lent H200 timed
them (benchmarks/gpu/results/2026-12-02-h200-table3/kernels.tgz: vLLM 0.26's ops at exact
shapes, replayed from CUDA graphs). Before, a piecewise prompt step paid the roofline's GEMMs
and attention alone: the eager per-layer cost it drops (hardware.EAGER_LAYER_S, fitted to
eager runs) held these kernels too."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.planner import costmodel, cudagraphs, hardware
from launcher.planner.hardware import HostProfile
from tests.launcher.gpushapes import h200_kernel_times, one_gpu, spec

# the five dense shapes the H200's kernel tables hold (the sixth, Moonlight, is a MoE)
DENSE = ("smollm2-1.7b-shape", "gemma-2-9b-shape", "mistral-nemo-12b-shape",
         "qwen2.5-14b-shape", "qwen2.5-14b-awq-shape")
NO_HOST = HostProfile(0.0, 0.0, 0.0, 0.0, "none", layer_launch_s=0.0)


def measured_elementwise_s(shape: str, tokens: int) -> float:
    """The H200's graph-replayed time of a layer's two norms, rotary and activation."""
    t = {r["op"]: r["seconds"] for r in h200_kernel_times(shape)
         if r["tokens"] == tokens and r["group"] == 0}
    return float(2 * t["norm"] + t["rope"] + t["act"])


@pytest.mark.parametrize("shape", DENSE)
@pytest.mark.parametrize("tokens", [1, 512])
def test_a_layers_elementwise_kernels_cost_what_the_h200_timed(shape: str, tokens: int) -> None:
    # one token: the kernels' fixed cost; 512 (the top of vLLM's default range): their bytes
    m = spec(shape)
    predicted = costmodel.elementwise_layer_s(m, one_gpu(m), tokens)
    assert predicted == pytest.approx(measured_elementwise_s(shape, tokens), rel=0.2)


@pytest.mark.parametrize("shape", DENSE)
def test_a_prompt_step_within_the_graphs_still_runs_its_layers_elementwise_kernels(
        shape: str) -> None:
    # the GPU's side alone (no host floor): the same 512 rows past the range (graphs to 64) and
    # within it (vLLM's default, to 512) differ by the eager cost less what a graph still runs
    m = spec(shape)
    eager = replace(one_gpu(m), host=NO_HOST)
    graphs = replace(one_gpu(m, cudagraphs.VLLM_RULE), host=NO_HOST)
    assert graphs.graphs.mode(512, 512) == "piecewise"
    dropped = costmodel.prefill_step_s(m, eager, 512) - costmodel.prefill_step_s(m, graphs, 512)
    kept = m.num_layers * hardware.EAGER_LAYER_S - dropped
    assert kept == pytest.approx(m.num_layers * measured_elementwise_s(shape, 512), rel=0.2)

