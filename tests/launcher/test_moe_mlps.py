"""A mixture of experts' MLPs beside the routed experts (issue 22): the shared experts' width and
the layers that run a dense MLP, read from the config fields vLLM's model classes read, and the
kernel step shape that times them. Without them the eleventh H200 table's GLM-4.7-Flash and
DeepSeek-V2-Lite shapes decoded 15% faster in plan than served."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.model.modelspec import _moe_mlps, spec_from_config
from launcher.planner import costmodel, kernelcost
from launcher.probe.kernels import MLP_LINEARS
from tests.launcher.gpushapes import MODELS


def config(name: str, **changes: Any) -> dict[str, Any]:
    cfg = json.loads((MODELS / name / "config.json").read_text())
    return {**cfg, **changes}


def test_deepseek_runs_its_shared_experts_in_moe_layers_and_a_dense_mlp_first() -> None:
    m = spec_from_config(config("deepseek-v2-lite-shape"), "dsv2")
    assert (m.shared_expert_intermediate_size, m.dense_mlp_layers) == (2 * 1408, 1)
    s = kernelcost.step_shape(m, tp=2)
    lin = {x.name: (x.k, x.n, x.layers) for x in s.linears}
    assert lin["shared_gate_up"] == (2048, 2816, 26)
    assert lin["shared_down"] == (1408, 2048, 26)
    assert lin["dense_gate_up"] == (2048, 10944, 1)
    assert lin["dense_down"] == (5472, 2048, 1)
    assert s.moe is not None
    assert s.moe.layers == 26
    # the roofline counts the same MoE layers for its decode kernels: one count for both
    assert costmodel.moe_layers(m) == 26
    # the probe and the untimed-kernel count know them as MLP linears by these names
    assert [x.name for x in s.linears if x.name in MLP_LINEARS] == [
        "shared_gate_up", "shared_down", "dense_gate_up", "dense_down"]


def test_moe_layer_frequency_leaves_the_other_layers_dense() -> None:
    m = spec_from_config(config("deepseek-v2-lite-shape", moe_layer_freq=2), "dsv2-every-other")
    # layer 0 by first_k_dense_replace, then the odd ones: 1 + 13 of 27
    assert m.dense_mlp_layers == 14


def test_qwen_moe_reads_its_shared_width_and_its_mlp_only_layers() -> None:
    cfg = config("qwen3-30b-a3b-shape", shared_expert_intermediate_size=5632,
                 mlp_only_layers=[0, 47], decoder_sparse_step=1)
    m = spec_from_config(cfg, "qwen-moe")
    assert (m.shared_expert_intermediate_size, m.dense_mlp_layers) == (5632, 2)
    m = spec_from_config(config("qwen3-30b-a3b-shape", decoder_sparse_step=2), "sparse-step")
    assert m.dense_mlp_layers == 24  # (i + 1) % 2 != 0 for the even indices


def test_a_moe_without_either_keeps_the_step_shape_it_had() -> None:
    m = spec_from_config(config("qwen3-30b-a3b-shape"), "qwen3-moe")
    assert (m.shared_expert_intermediate_size, m.dense_mlp_layers) == (0, 0)
    s = kernelcost.step_shape(m)
    assert [x.name for x in s.linears] == ["qkv", "o"]
    assert s.moe is not None
    assert s.moe.layers == 48


def test_a_dense_model_has_neither() -> None:
    m = spec_from_config(config("qwen2.5-1.5b-shape", first_k_dense_replace=3,
                                n_shared_experts=2), "dense")
    assert (m.shared_expert_intermediate_size, m.dense_mlp_layers) == (0, 0)


junk = st.one_of(
    st.none(), st.integers(-5, 100), st.floats(), st.just(float("inf")), st.text(max_size=4),
    st.booleans(), st.lists(st.one_of(st.integers(-3, 60), st.text(max_size=2)), max_size=5),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@settings(max_examples=150, deadline=None)
@given(layers=st.integers(1, 64), experts=st.integers(0, 8), moe_inter=st.integers(0, 4096),
       fields=st.dictionaries(st.sampled_from(["shared_expert_intermediate_size",
                                               "n_shared_experts", "first_k_dense_replace",
                                               "moe_layer_freq", "decoder_sparse_step",
                                               "mlp_only_layers"]), junk))
def test_any_moe_fields_give_counts_within_the_model_or_none(
        layers: int, experts: int, moe_inter: int, fields: dict[str, Any]) -> None:
    shared, dense = _moe_mlps({"moe_intermediate_size": moe_inter, **fields}, layers, experts)
    assert shared >= 0
    assert 0 <= dense <= layers
    if not experts:
        assert (shared, dense) == (0, 0)
