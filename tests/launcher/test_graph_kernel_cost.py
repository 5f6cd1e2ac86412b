"""A kernel's fixed cost in a CUDA-graph replay (issue 22): `probe --measure` times it on the
user's GPU (launcher/probe/measure.py, gpuperf.graph_kernel_fit), the topology keeps it, and a
decode step within the graphs pays it for every kernel of every layer, the layer's kernels
from the family registry (costmodel.decode_step_s, families.decode_layer_kernels)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.model import families
from launcher.planner import costmodel, hardware
from launcher.planner.costmodel import Layout
from launcher.planner.hardware import HostProfile
from launcher.probe import gpuperf, measure
from launcher.probe.gpuperf import GpuPerf, GraphSample
from tests.launcher.gpushapes import one_gpu, spec

NO_HOST = HostProfile(0.0, 0.0, 0.0, 0.0, "none", layer_launch_s=0.0)


def line(fixed_s: float, gbs: float, ns: tuple[int, ...] = gpuperf.GRAPH_GEMV_NS,
         calls: int = 40) -> list[GraphSample]:
    k = gpuperf.GRAPH_GEMV_K
    return [GraphSample(k, n, calls, calls * (fixed_s + k * n * 2 / (gbs * 1e9))) for n in ns]


# ------------------------------------------------------------------------- the measurement


def test_the_fit_splits_a_kernels_fixed_cost_from_its_bytes() -> None:
    fixed, gbs = gpuperf.graph_kernel_fit(line(4.2e-6, 4073.0)) or (0.0, 0.0)
    assert fixed == pytest.approx(4.2e-6, rel=1e-6)
    assert gbs == pytest.approx(4073.0, rel=1e-6)


@pytest.mark.parametrize("samples", [
    line(4e-6, 4000.0, ns=(4096,)),  # one size: no line
    line(4e-6, 4000.0, ns=(4096, 4096)),
    [GraphSample(4096, 1024, 40, 40 * 20e-6), GraphSample(4096, 8192, 40, 40 * 2e-6)],  # slope < 0
    line(-3e-6, 4000.0),  # crosses zero bytes below zero: too noisy to split
    [],
])
def test_a_line_that_gives_no_positive_fixed_cost_and_rate_is_no_figure(
        samples: list[GraphSample]) -> None:
    assert gpuperf.graph_kernel_fit(samples) is None


def test_the_measured_kernel_cost_is_saved_and_read_back() -> None:
    perf = GpuPerf(None, 4041.0, "NVIDIA H200", "x", (), 3.1e-6, tuple(line(3.1e-6, 4000.0)))
    back, reasons = gpuperf.perf_from_json(gpuperf.perf_to_json(perf))
    assert reasons == []
    assert back is not None
    assert back.kernel_s == 3.1e-6
    assert back.graph_samples == perf.graph_samples
    assert "3.10 us a kernel in a CUDA graph" in back.describe()


@pytest.mark.parametrize("bad", [0.5, -1e-6, "fast", True, float("nan")])
def test_a_kernel_cost_that_is_not_seconds_is_ignored_with_a_reason(bad: Any) -> None:
    perf, reasons = gpuperf.perf_from_json({"decode_gbs": 4041.0, "kernel_s": bad})
    assert perf is not None
    assert perf.kernel_s is None
    assert any("kernel_s" in r and "shipped per-kernel figure" in r for r in reasons)


def test_without_cuda_the_graph_timing_is_skipped_with_a_reason() -> None:
    kernel_s, samples, note = measure.graph_kernel(SimpleNamespace(), "cpu")
    assert (kernel_s, samples) == (None, ())
    assert note is not None
    assert "no CUDA" in note
    assert "\n" not in note


def test_a_failing_graph_capture_is_a_reason_not_a_failed_probe() -> None:
    def broken(*_a: object, **_k: object) -> object:
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")

    torch = SimpleNamespace(randn=broken, bfloat16=None)
    kernel_s, samples, note = measure.graph_kernel(torch, "cuda")
    assert (kernel_s, samples) == (None, ())
    assert note is not None
    assert "RuntimeError" in note
    assert "\n" not in note


def test_a_noisy_timing_is_said_and_its_samples_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    noisy = line(-3e-6, 4000.0)
    monkeypatch.setattr(measure, "time_graph_gemvs", lambda torch: noisy)
    kernel_s, samples, note = measure.graph_kernel(SimpleNamespace(), "cuda")
    assert kernel_s is None
    assert samples == tuple(noisy)
    assert note is not None
    assert "no positive fixed cost" in note


# ---------------------------------------------------------------------- the figure it plans by


def test_a_measured_kernel_cost_replaces_the_shipped_one_and_other_cards_assume_it() -> None:
    h200 = hardware.gpu_model("NVIDIA H200")
    assert h200.graph_kernel_s == 4.2e-6  # DERIVED (hardware.GPU_TABLE says from what)
    assert hardware.gpu_model("NVIDIA H200", perf=GpuPerf(kernel_s=2e-6)).graph_kernel_s == 2e-6
    # a measurement of the rates only keeps the row's kernel figure
    assert hardware.gpu_model("NVIDIA H200", perf=GpuPerf(decode_gbs=4041.0)).graph_kernel_s \
        == 4.2e-6
    assert hardware.gpu_model("NVIDIA GeForce RTX 4090").graph_kernel_s is None


def layout_with_kernel_s(lay: Layout, kernel_s: float | None) -> Layout:
    stages = tuple(tuple(replace(g, perf=GpuPerf(decode_gbs=4041.0, kernel_s=kernel_s))
                         for g in stage) for stage in lay.stages)
    return replace(lay, stages=stages, host=NO_HOST)


@pytest.mark.parametrize("name", ["qwen3-4b-shape", "gemma-3-12b-shape", "qwen3-30b-a3b-shape",
                                  "glm-4.7-flash-shape"])
def test_a_full_graph_decode_step_pays_every_kernel_of_every_layer(name: str) -> None:
    m = spec(name)
    lay = one_gpu(m)
    assert lay.graphs.mode(0, 1) == "full"
    # a mixture of experts' dense-MLP layers (GLM's first) run a dense layer's kernels
    moe = costmodel.moe_layers(m)
    kernels = ((m.num_layers - moe) * families.decode_layer_kernels(m.family, moe=False)
               + moe * families.decode_layer_kernels(m.family, moe=True))
    one, two = (costmodel.decode_step_s(m, layout_with_kernel_s(lay, k), 1, 640)
                for k in (2e-6, 4e-6))
    assert two - one == pytest.approx(kernels * 2e-6, rel=1e-9)


def test_a_moe_layer_runs_the_fused_moe_kernels_in_place_of_its_mlps() -> None:
    for fam in ("llama", "qwen3", "deepseek", "glm4_moe_lite", "gemma3"):
        dense = families.decode_layer_kernels(fam, moe=False)
        assert dense == families.eager_layer_kernels(fam)
        assert families.decode_layer_kernels(fam, moe=True) == \
            dense - families.DENSE_MLP_KERNELS + families.FUSED_MOE_KERNELS


def test_the_engines_overhead_runs_beside_a_decode_step_without_pipeline_stages() -> None:
    m = spec("qwen3-14b-shape")
    lay = layout_with_kernel_s(one_gpu(m), 4.2e-6)
    step = costmodel.decode_step_s(m, lay, 1, 640)
    nothing = costmodel.decode_step_s(m, layout_with_kernel_s(one_gpu(m), 1e-12), 1, 640)
    kernels = m.num_layers * families.decode_layer_kernels(m.family, moe=False) * 4.2e-6
    # the GPU's work (the weights' read and each kernel's cost), not that plus the engine's
    assert step == pytest.approx(nothing + kernels, rel=1e-6)
    assert step > hardware.STEP_OVERHEAD_S
    # a model with less GPU work than the engine's overhead takes the overhead
    tiny = spec("llama-3.2-1b-shape")
    assert costmodel.decode_step_s(tiny, layout_with_kernel_s(one_gpu(tiny), 1e-12), 1, 640) \
        == pytest.approx(hardware.STEP_OVERHEAD_S)
