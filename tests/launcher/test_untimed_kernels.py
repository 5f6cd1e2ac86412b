"""Kernels a decoder layer runs that no timed op of its kernel table holds (issue 22's eleventh
H200 table: Gemma-3-4B's kernel-table decode ran +25% fast, its roofline, which charges every
counted kernel, within 2%): each costs a step a CUDA-graph kernel's fixed cost."""

from __future__ import annotations

import pytest

from launcher.model import families
from launcher.planner.kernelcost import step_cost, step_shape, untimed_layer_kernels
from launcher.probe.kernels import KernelTable, KernelTime, TableKey
from tests.launcher.gpushapes import spec


def test_a_llama_layer_leaves_one_kernel_untimed_the_kv_cache_write() -> None:
    m = spec("llama-3.2-1b-shape")
    assert families.eager_layer_kernels(m.family) == families.REFERENCE_LAYER_KERNELS
    assert untimed_layer_kernels(m, step_shape(m)) == 1


def test_gemma3s_extra_norm_is_one_more_untimed_kernel_than_llamas() -> None:
    m = spec("gemma-3-4b-shape")
    assert untimed_layer_kernels(m, step_shape(m)) == 2


def test_a_moe_layers_shared_experts_and_latent_projections_count_as_timed() -> None:
    # GLM-4.7-Flash: four latent projections and the shared experts' MLP timed, so only the
    # KV-cache write is left of the DeepSeek layer's 12 (the fused-MoE op on both sides)
    m = spec("glm-4.7-flash-shape")
    assert untimed_layer_kernels(m, step_shape(m)) == 1


def test_each_untimed_kernel_adds_its_graph_cost_to_every_step() -> None:
    m = spec("llama-3.2-1b-shape")
    s = step_shape(m)
    ops = [f"linear:{x.name}" for x in s.linears] + ["norm", "rope", "act"]
    times = [KernelTime(op, n, 1e-6 * n) for op in ops for n in (1, 64)]
    times += [KernelTime("attn:decode", 4, 4e-5, 100), KernelTime("head", 1, 1e-4)]
    table = KernelTable(TableKey("gpu", "d", "v", "t", s.key()), s, tuple(times), "synthetic",
                        "now", None, (), ())
    plain = step_cost(table, assumed_step_overhead_s=0.0).cost
    charged = step_cost(table, assumed_step_overhead_s=0.0, untimed_kernels=(16, 5e-6))
    for n in (1, 64):
        assert charged.cost.forward(n) - plain.forward(n) == pytest.approx(16 * 5e-6)
    assert any("16 kernels a step that no timed op holds" in x for x in charged.sources)
