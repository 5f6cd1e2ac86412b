"""Recent model families as users bring them: the real config.json files under
tests/fixtures/recent-models (README there says where each comes from), planned from the folder
alone. Each is sized from its own shape (hybrid Mamba and linear-attention layers, chunked
attention, latent attention, nested text configs, ModelOpt and compressed-tensors
quantizations), named by the family registry, and planned on a few machines, or refused in one
line; never another exception. (test_config_inputs.py damages them at random keys too.)"""

from __future__ import annotations

import builtins
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from launcher.errors import ModelError, PlanError
from launcher.model import hfconfig, quantization, toolcalls
from launcher.model.modelspec import ModelSpec, load_model_spec, spec_from_config
from launcher.planner.plan import Policy, plan
from launcher.probe.topology import load_topology
from tests.launcher.paths import REPO, topo

RECENT = REPO / "tests" / "fixtures" / "recent-models"
FOLDERS = sorted(p.name for p in RECENT.iterdir() if (p / "config.json").is_file())
# refused before any plan (test_a_model_sized_by_its_own_code_is_refused_saying_so)
SIZED_BY_OWN_CODE = ("llama-3.3-nemotron-super-49b-v1",)


def spec(name: str) -> ModelSpec:
    return load_model_spec(str(RECENT / name))


def config(name: str) -> dict[str, Any]:
    found = json.loads((RECENT / name / "config.json").read_text())
    assert isinstance(found, dict)
    return found


@pytest.fixture
def fresh_shapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shape counted here, none read from an earlier run's cache."""
    monkeypatch.setenv("TOPOSERVE_CACHE", str(tmp_path))
    hfconfig._shape.cache_clear()


def test_the_fixture_folder_holds_the_families_this_file_plans() -> None:
    assert len(FOLDERS) >= 12


# ------------------------------------------------------------------ remote code, stdout


def test_a_config_naming_its_own_code_never_asks_to_run_it(
        fresh_shapes: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Kimi-K2.5's auto_map names modelling code of its own: transformers asked "Do you wish to
    # run the custom code? [y/N]" on stdout and waited, inside `launcher plan --json`
    asked: list[str] = []

    def answer(prompt: str = "") -> str:
        asked.append(prompt)
        return "n"

    monkeypatch.setattr(builtins, "input", answer)
    m = spec("kimi-k2.5")
    assert asked == []
    assert capsys.readouterr().out == ""
    assert m.params > 900e9


# ------------------------------------------------------------------------ hybrid models


def test_nemotron_h_caches_keys_and_values_in_its_attention_layers_alone(
        fresh_shapes: None) -> None:
    m = spec("nemotron-3-nano-30b-a3b")
    pattern = config("nemotron-3-nano-30b-a3b")["hybrid_override_pattern"]
    assert m.num_layers == len(pattern) == 52
    assert sum(g.layers for g in m.kv_groups) == pattern.count("*") == 6
    assert m.recurrent_layers == pattern.count("M") == 23
    assert 31.0e9 < m.params < 32.2e9  # the model card: 31.6B in all
    assert (m.num_experts, m.experts_per_token) == (128, 6)


def test_a_config_giving_only_its_layer_types_is_sized(fresh_shapes: None) -> None:
    # Nemotron 3 Ultra's config.json has layers_block_type and no num_hidden_layers (its
    # config class derives it); refused as "lacks 'num_hidden_layers'" before
    cfg = config("nemotron-3-ultra-550b-a55b")
    assert "num_hidden_layers" not in cfg
    m = spec("nemotron-3-ultra-550b-a55b")
    assert m.num_layers == len(cfg["layers_block_type"])
    assert sum(g.layers for g in m.kv_groups) == cfg["layers_block_type"].count("attention")
    assert 540e9 < m.params < 560e9


def test_a_dense_hybrid_is_no_mixture_of_experts_by_its_config_class_default(
        fresh_shapes: None) -> None:
    # NemotronHConfig defaults n_routed_experts to 8; Nemotron-H-56B's pattern has no MoE layer
    m = spec("nemotron-h-56b-base-8k")
    assert m.num_experts == 0
    assert m.active_params == m.params


def test_linear_attention_layers_hold_their_recurrent_state_per_sequence(
        fresh_shapes: None) -> None:
    m = spec("qwen3-next-80b-a3b-thinking")
    t = config("qwen3-next-80b-a3b-thinking")
    layers = t["num_hidden_layers"] - t["num_hidden_layers"] // t["full_attention_interval"]
    assert m.recurrent_layers == layers == 36
    assert sum(g.layers for g in m.kv_groups) == 12
    # vLLM's gated delta-net state (MambaStateShapeCalculator.gated_delta_net_state_shape):
    # conv (2 k heads x k dim + v heads x v dim) x (kernel - 1), recurrence v heads x v x k,
    # both in bf16, two pages a layer with prefix caching (mamba_cache_mode "align")
    conv = (2 * t["linear_num_key_heads"] * t["linear_key_head_dim"]
            + t["linear_num_value_heads"] * t["linear_value_head_dim"]) * (
        t["linear_conv_kernel_dim"] - 1)
    state = t["linear_num_value_heads"] * t["linear_value_head_dim"] * t["linear_key_head_dim"]
    assert m.recurrent_state_bytes == 2 * layers * 2 * (conv + state)
    attention_only = sum(g.layers * g.bytes_per_token() for g in m.kv_groups)
    assert m.kv_bytes(1) == attention_only + m.recurrent_state_bytes
    assert m.kv_bytes(2) - m.kv_bytes(1) == attention_only  # the state does not grow


def test_a_mamba_state_is_kept_in_the_dtype_the_config_names(fresh_shapes: None) -> None:
    m = spec("nemotron-3-nano-30b-a3b")
    t = config("nemotron-3-nano-30b-a3b")
    assert t["mamba_ssm_cache_dtype"] == "float32"
    conv = (t["mamba_num_heads"] * t["mamba_head_dim"]
            + 2 * t["n_groups"] * t["ssm_state_size"]) * (t["conv_kernel"] - 1)
    state = t["mamba_num_heads"] * t["mamba_head_dim"] * t["ssm_state_size"]
    assert m.recurrent_state_bytes == 2 * m.recurrent_layers * (2 * conv + 4 * state)


def test_a_multimodal_hybrid_counts_its_text_layers_state(fresh_shapes: None) -> None:
    m = spec("qwen3.5-27b")
    types = config("qwen3.5-27b")["text_config"]["layer_types"]
    assert m.recurrent_layers == types.count("linear_attention")
    assert sum(g.layers for g in m.kv_groups) == types.count("full_attention")


def test_a_delta_attention_mixer_named_self_attn_is_recurrent_not_kv(fresh_shapes: None) -> None:
    # Kimi-Linear (transformers' KimiLinearConfig defaults; no real config.json its class
    # builds was found): its KDA layers are modules named self_attn with a causal convolution
    from transformers import CONFIG_MAPPING

    cfg = json.loads(json.dumps(CONFIG_MAPPING["kimi_linear"]().to_dict(), default=str))
    m = spec_from_config(cfg, "kimi-linear")
    types = cfg["layer_types"]
    assert sum(g.layers for g in m.kv_groups) == types.count("full_attention")
    assert m.recurrent_layers == types.count("linear_attention")
    assert m.recurrent_state_bytes > 0


def test_a_model_without_recurrent_layers_holds_no_state(fresh_shapes: None) -> None:
    assert spec("gpt-oss-120b").recurrent_state_bytes == 0


def test_a_model_sized_by_its_own_code_is_refused_saying_so(fresh_shapes: None) -> None:
    # Llama-3.3-Nemotron-Super (model_type nemotron-nas, DeciLM's code): KV heads and MLP
    # widths per layer in block_configs, null at the top; was "a value this planner cannot
    # read (int() argument ... not 'NoneType'); is it a decoder-only language model?"
    with pytest.raises(ModelError) as refused:
        spec(SIZED_BY_OWN_CODE[0])
    message = str(refused.value)
    assert "\n" not in message
    assert "own code" in message
    assert "num_key_value_heads" in message
    assert "--trust-remote-code" in message


# ------------------------------------------------------------------- chunked attention


def test_llama4_chunked_attention_layers_keep_one_chunk(fresh_shapes: None) -> None:
    m = spec("llama-4-scout-17b-16e-instruct")
    chunk = config("llama-4-scout-17b-16e-instruct")["text_config"]["attention_chunk_size"]
    assert {(g.layers, g.window, g.chunked) for g in m.kv_groups} == {
        (36, chunk, True), (12, None, False)}
    assert (m.sliding_layers, m.chunked_layers, m.attention_chunk) == (0, 36, chunk)
    per_layer = m.kv_bytes_per_layer_token()
    assert m.kv_bytes(131072) == per_layer * (12 * 131072 + 36 * chunk)
    assert 200e9 < m.weight_bytes < 230e9  # 107.8B parameters in bf16 (the copy has no tower)


def test_launcher_model_says_llama4s_chunked_layers_keep_one_chunk(fresh_shapes: None) -> None:
    from launcher.cli.cmd_model import format_model

    text = format_model(spec("llama-4-scout-17b-16e-instruct"))
    assert "36 chunked-attention layers keep at most one 8192-token chunk" in text
    assert "sliding" not in text


# ---------------------------------------------------------------------- family registry


@pytest.mark.parametrize(("name", "family", "parser"), [
    ("qwen3-vl-30b-a3b-instruct", "qwen3", "hermes"),
    ("kimi-k2.5", "kimi_k2", "kimi_k2"),
    ("kimi-k2-instruct", "kimi_k2", "kimi_k2"),
    ("deepseek-v3", "deepseek_v3", "deepseek_v3"),
])
def test_a_checkpoint_gets_its_familys_tool_parser_whatever_its_text_config_is(
        fresh_shapes: None, name: str, family: str, parser: str) -> None:
    m = spec(name)
    assert m.family == family
    assert toolcalls.choose_tool_parser(m.family, None)[0] == parser


# ------------------------------------------------------------------------- quantization


def test_modelopts_side_quant_config_sizes_the_checkpoint_as_stored(
        fresh_shapes: None, tmp_path: Path) -> None:
    m = spec("llama-3.1-70b-instruct-fp8")
    assert (m.quantization, m.weight_bits) == ("modelopt", 8.0)
    assert 70e9 < m.weight_bytes < 76e9  # the FP8 checkpoint: ~75 GB
    alone = tmp_path / "config-only"
    alone.mkdir()
    shutil.copy(RECENT / "llama-3.1-70b-instruct-fp8" / "config.json", alone)
    assert load_model_spec(str(alone)).weight_bytes > 140e9  # no side file: 16 bits


def test_int4_experts_with_attention_ignored_pack_the_experts_alone(fresh_shapes: None) -> None:
    # Kimi-K2.5: compressed-tensors INT4 in groups of 32 (a bf16 scale each), its ignore list
    # keeping attention, shared experts and dense MLPs at 16 bits
    cfg = config("kimi-k2.5")
    m = spec_from_config(cfg, "kimi-k2.5")
    shape = hfconfig.shape(cfg)
    assert shape is not None
    experts = shape.expert_params
    rest = shape.linear_params - experts + shape.embedding_params + shape.lm_head_params + (
        shape.other_params)
    assert m.weight_bytes == pytest.approx(experts * (0.5 + 2 / 32) + rest * 2, rel=1e-6)
    assert 585e9 < m.weight_bytes < 605e9


def test_gpt_oss_120b_weighs_its_mxfp4_checkpoint(fresh_shapes: None) -> None:
    m = spec("gpt-oss-120b")
    assert 60e9 < m.weight_bytes < 67e9  # the published checkpoint: ~65 GB


def test_modelopt_mixed_precision_takes_its_widest_layer() -> None:
    # two of the per-layer entries of nvidia/Qwen3.6-35B-A3B-NVFP4's quantization_config
    q = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "model.language_model.layers.0.linear_attn.out_proj": {"quant_algo": "FP8"},
        "model.language_model.layers.0.mlp.experts": {"quant_algo": "W4A16_NVFP4",
                                                      "group_size": 16}}}
    assert quantization.read({"quantization_config": q}, {}) == ("modelopt", 8.0, 0.0)
    side = {"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "MIXED_PRECISION", "quantized_layers": {
            "model.layers.0.mlp.experts": {"quant_algo": "W4A16_NVFP4"}}}}
    assert quantization.read({"quantization_config": side}, {}) == ("modelopt", 4.0, 1 / 16)


# ------------------------------------------------------------------------------ planning

TOPOLOGIES = {name: load_topology(topo(name), {}) for name in
              ("h200x2-nvlink", "2x3090-pcie-x8x8-nop2p", "8xh100-nvswitch")}


@pytest.mark.parametrize("name", [f for f in FOLDERS if f not in SIZED_BY_OWN_CODE])
def test_a_recent_model_plans_or_is_refused_in_one_line(name: str) -> None:
    m = spec(name)
    for machine, topology in TOPOLOGIES.items():
        have = sum(g.memory_bytes for g in topology.gpus)
        refusal = ""
        try:
            chosen = plan(topology, m, Policy())
        except PlanError as exc:
            refusal = str(exc).strip()
        if refusal:
            assert "\n" not in refusal, machine
            # refused only where the weights take most of the machine's memory
            assert m.weight_bytes > 0.5 * have, (machine, refusal)
        else:
            # what it chose holds the weights
            assert chosen.max_model_len > 0
            assert m.weight_bytes < have, machine


def test_llama4s_plan_names_its_chunked_attention_not_a_sliding_window(
        fresh_shapes: None) -> None:
    # A chunked layer attends within its own 8,192-token chunk (vLLM's
    # ChunkedLocalAttentionSpec); a sliding window would attend over the last 8,192 tokens
    m = spec("llama-4-scout-17b-16e-instruct")
    chosen = plan(TOPOLOGIES["8xh100-nvswitch"], m, Policy())
    line = next(r for r in chosen.reasons if r.startswith(f"{m.name}:"))
    assert line.endswith(", 36 chunked-attention layers (8192-token chunks)")
    assert "sliding" not in line


def test_a_model_far_larger_than_the_machine_is_refused() -> None:
    with pytest.raises(PlanError):
        plan(TOPOLOGIES["2x3090-pcie-x8x8-nop2p"], spec("deepseek-v3"), Policy())
