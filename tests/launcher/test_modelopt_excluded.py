"""A ModelOpt checkpoint's modules left unquantized (``exclude_modules`` in hf_quant_config.json's
quantization block, ``ignore`` in config.json) are sized at 16 bits, matched as vLLM matches
them (quantization.Unquantized against ModelOptQuantConfigBase.is_layer_excluded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.model import hfconfig, quantization
from launcher.model.modelspec import ModelSpec, load_model_spec, spec_from_config
from launcher.planner import costmodel, memfit
from tests.launcher.paths import model

LLAMA = json.loads(Path(model("llama-3.1-8b"), "config.json").read_text())
MOE = json.loads(Path(model("qwen3-30b-a3b"), "config.json").read_text())
# bytes a weight takes: ModelOpt FP8, NVFP4 (an FP8 scale per 16), and the model's bf16
FP8, NVFP4, BF16 = 1.0, 0.5 + 1 / 16, 2.0


def side_file(algo: str, exclude: Any) -> dict[str, Any]:
    """hf_quant_config.json as ModelOpt writes it (kept beside config.json)."""
    return {"producer": {"name": "modelopt", "version": "0.23.0"},
            "quantization": {"quant_algo": algo, "kv_cache_quant_algo": "FP8",
                             "exclude_modules": exclude}}


def sized(cfg: dict[str, Any], q: dict[str, Any] | None) -> ModelSpec:
    return spec_from_config({**cfg, "quantization_config": q}, "generated")


def shape(cfg: dict[str, Any]) -> hfconfig.HfShape:
    found = hfconfig.shape(cfg)
    assert found is not None
    return found


def params(cfg: dict[str, Any], *names: str) -> int:
    """Linear parameters of the modules ``names`` (transformers' names) of ``cfg``'s model."""
    modules = dict(shape(cfg).linear_modules)
    return sum(modules[n] for n in names)


def attention(layer: int) -> tuple[str, ...]:
    return tuple(f"model.layers.{layer}.self_attn.{p}_proj" for p in "qkvo")


# ------------------------------------------------------------------------- sizes


def test_an_fp8_checkpoint_whose_lm_head_is_excluded_is_sized_with_a_bf16_lm_head() -> None:
    # nvidia/Llama-3.1-70B-Instruct-FP8's list is ["lm_head"]; Llama-3.1-8B's head is untied
    hf = shape(LLAMA)
    m = sized(LLAMA, side_file("FP8", ["lm_head"]))
    assert hf.lm_head_params == LLAMA["vocab_size"] * LLAMA["hidden_size"]
    others = hf.embedding_params + hf.lm_head_params + hf.other_params
    assert m.weight_bytes == int(hf.linear_params * FP8 + others * BF16)
    assert m.notes == ()


def test_excluded_attention_layers_are_sized_at_16_bits_the_rest_packed() -> None:
    hf = shape(LLAMA)
    others = (hf.embedding_params + hf.lm_head_params + hf.other_params) * BF16
    for algo, packed in (("FP8", FP8), ("NVFP4", NVFP4)):
        m = sized(LLAMA, side_file(algo, ["lm_head", "model.layers.0.self_attn*"]))
        kept = params(LLAMA, *attention(0))
        assert m.weight_bytes == int((hf.linear_params - kept) * packed + kept * BF16 + others)


def test_a_wildcard_exclusion_is_a_shell_pattern_over_the_whole_name() -> None:
    # fnmatch, as vLLM: "model.layers.1*" is layers 1 and 10-19 (11 of 32), not layer 2
    one = sized(LLAMA, side_file("FP8", ["model.layers.1*"]))
    base = sized(LLAMA, side_file("FP8", []))
    layers = [1, *range(10, 20)]
    kept = sum(n for name, n in shape(LLAMA).linear_modules
               if any(name.startswith(f"model.layers.{i}.") for i in layers))
    assert one.weight_bytes - base.weight_bytes == int(kept * (BF16 - FP8))
    every_attention = sized(LLAMA, side_file("FP8", ["*self_attn*"]))
    assert every_attention.weight_bytes - base.weight_bytes == int(
        sum(params(LLAMA, *attention(i)) for i in range(32)) * (BF16 - FP8))


def test_a_fused_name_excludes_its_shards_and_no_other_projection() -> None:
    m = sized(LLAMA, side_file("FP8", ["model.layers.3.self_attn.qkv_proj"]))
    base = sized(LLAMA, side_file("FP8", []))
    qkv = params(LLAMA, *attention(3)[:3])
    assert m.weight_bytes - base.weight_bytes == int(qkv * (BF16 - FP8))


def test_one_excluded_expert_leaves_its_layers_fused_experts_at_16_bits() -> None:
    # vLLM runs a layer's experts as one fused MoE: is_layer_skipped excludes it where an
    # entry names any of its experts
    base = sized(MOE, side_file("NVFP4", []))
    m = sized(MOE, side_file("NVFP4", ["model.layers.5.mlp.experts.17.down_proj"]))
    experts = params(MOE, "model.layers.5.mlp.experts")
    assert experts == 128 * 3 * MOE["hidden_size"] * MOE["moe_intermediate_size"]
    assert m.weight_bytes - base.weight_bytes == int(experts * (BF16 - NVFP4))


def test_an_excluded_router_or_tower_or_head_changes_nothing_already_16_bit() -> None:
    base = sized(MOE, side_file("NVFP4", []))
    listed = sized(MOE, side_file("NVFP4", ["lm_head", "*mlp.gate", "model.layers.*.mlp.gate",
                                            "vision_tower*", "model.embed_tokens"]))
    assert listed.weight_bytes == base.weight_bytes


def test_config_json_ignore_list_is_read_where_vllm_reads_it() -> None:
    # ModelOpt 0.31+ writes its quantization into config.json, the exclusions as "ignore"
    q = {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["*self_attn*"],
         "producer": {"name": "modelopt"}}
    m = sized(LLAMA, q)
    assert m.weight_bytes == sized(LLAMA, side_file("FP8", ["*self_attn*"])).weight_bytes
    assert m.notes == ()
    # vLLM's "modelopt_fp4" spelling is ModelOpt's too
    fp4 = sized(LLAMA, {**q, "quant_method": "modelopt_fp4", "quant_algo": "NVFP4"})
    assert (fp4.quantization, fp4.weight_bits) == ("modelopt", 4.0)
    assert fp4.weight_bytes == sized(LLAMA, side_file("NVFP4", ["*self_attn*"])).weight_bytes


def test_top_level_exclude_modules_is_sized_at_16_bits_with_a_note() -> None:
    q = {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["*self_attn*"]}
    m = sized(LLAMA, q)
    assert m.weight_bytes == sized(LLAMA, side_file("FP8", ["*self_attn*"])).weight_bytes
    assert len(m.notes) == 1
    assert "not read by vLLM" in m.notes[0]


@pytest.mark.parametrize("q", [
    side_file("FP8", "lm_head"),  # a string for a list
    side_file("FP8", ["lm_head", 7]),  # an entry that is no name
    side_file("FP8", [""]),  # vLLM finds "" in every name
    {"producer": {"name": "modelopt"}, "quantization": ["FP8"]},
    {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": {"lm_head": True}},
])
def test_an_unreadable_exclusion_list_sizes_every_layer_at_16_bits_with_a_note(
        q: dict[str, Any]) -> None:
    m = sized(LLAMA, q)
    assert m.weight_bytes == sized(LLAMA, None).weight_bytes
    assert len(m.notes) == 1


def test_a_model_transformers_cannot_build_matches_its_exclusions_by_llama_names() -> None:
    cfg = {**LLAMA, "model_type": "not_in_transformers", "architectures": ["Unknown"]}
    assert hfconfig.shape(cfg) is None
    base = sized(cfg, side_file("FP8", ["lm_head"]))
    m = sized(cfg, side_file("FP8", ["lm_head", "model.layers.0.self_attn*"]))
    h, heads, kv = LLAMA["hidden_size"], LLAMA["num_attention_heads"], LLAMA["num_key_value_heads"]
    head_dim = h // heads
    attention_0 = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    assert m.weight_bytes - base.weight_bytes == int(attention_0 * (BF16 - FP8))
    every = sized(cfg, side_file("FP8", ["model.layers.*"]))
    assert every.weight_bytes == sized(cfg, None).weight_bytes


def test_what_a_card_holds_and_a_decode_step_reads_count_excluded_modules_at_16_bits() -> None:
    base = sized(LLAMA, side_file("FP8", []))
    m = sized(LLAMA, side_file("FP8", ["*self_attn*"]))
    grown = m.weight_bytes - base.weight_bytes
    assert grown > 0
    assert memfit.held_weight_bytes(m) - memfit.held_weight_bytes(base) == grown
    assert memfit.weights_per_gpu(m, 2, 1) - memfit.weights_per_gpu(base, 2, 1) == grown / 2
    assert costmodel.streamed_weight_bytes(m) - costmodel.streamed_weight_bytes(base) == grown


def test_the_side_file_beside_a_config_only_folder_gives_the_exclusions(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    (tmp_path / "hf_quant_config.json").write_text(
        json.dumps(side_file("FP8", ["lm_head", "*self_attn*"])))
    m = load_model_spec(str(tmp_path))
    assert m.weight_bytes == sized(LLAMA, side_file("FP8", ["*self_attn*"])).weight_bytes


# ------------------------------------------------------- against vLLM's own matching

_PIECES = ["model", "layers", "0", "1", "12", "self_attn", "q_proj", "o_proj", "mlp", "gate",
           "gate_proj", "down_proj", "experts", "lm_head", "language_model", "*", "?", "[0-9]"]
_PATTERN = st.lists(st.sampled_from(_PIECES), min_size=1, max_size=5).map(
    lambda parts: ".".join(parts)) | st.builds(
    lambda a, b: a + b, st.sampled_from(["", "*", "model.layers."]),
    st.sampled_from(["0*", "1*", "*self_attn*", "self_attn", "mlp.gate", "experts", "lm_head",
                     "*experts.3.*", "model.layers.0.mlp.experts.3.w1"]))
_LAYER = ["model.layers.0", "model.layers.1", "model.layers.12", "language_model.model.layers.1"]
_NAME = st.builds(lambda at, part: f"{at}.{part}", st.sampled_from(_LAYER),
                  st.sampled_from(["self_attn.o_proj", "mlp.down_proj", "mlp.experts",
                                   "mlp.shared_experts.down_proj", "self_attn.kv_a_proj"]))


def _vllm_excludes(patterns: list[str], prefix: str) -> bool:
    """vLLM 0.32's own answer: ModelOptQuantConfigBase.is_layer_excluded, without and with the
    hf_to_vllm_mapper rewrite (an identity mapper: only the trailing-"*" rewrite)."""
    modelopt = pytest.importorskip("vllm.model_executor.layers.quantization.modelopt")
    from vllm.model_executor.models.utils import WeightsMapper

    q = {"quantization": {"quant_algo": "FP8", "exclude_modules": list(patterns)}}
    plain = modelopt.ModelOptFp8Config.from_config(q)
    mapped = modelopt.ModelOptFp8Config.from_config(q)
    mapped.apply_vllm_mapper(WeightsMapper())
    return bool(plain.is_layer_excluded(prefix) or mapped.is_layer_excluded(prefix))


@settings(max_examples=300, deadline=None)
@given(patterns=st.lists(_PATTERN, min_size=1, max_size=3), name=_NAME)
def test_a_module_is_excluded_exactly_where_vllm_excludes_it(patterns: list[str],
                                                              name: str) -> None:
    ours = quantization.Unquantized(tuple(patterns)).excludes(name)
    if name.startswith("language_model.model."):
        # transformers 5's spelling of the same module is excluded alike (vLLM sees one)
        other = name.replace("language_model.model.", "model.language_model.", 1)
        assert ours == quantization.Unquantized(tuple(patterns)).excludes(other)
        assert ours >= _vllm_excludes(patterns, name)
    else:
        assert ours == _vllm_excludes(patterns, name)


def test_a_fused_layer_vllm_excludes_is_excluded_shard_by_shard() -> None:
    modelopt = pytest.importorskip("vllm.model_executor.layers.quantization.modelopt")
    fused = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    for patterns in (["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                      "model.layers.0.self_attn.v_proj"], ["*qkv_proj"], ["*gate_up*"],
                     ["model.layers.0.mlp"]):
        config = modelopt.ModelOptFp8Config.from_config(
            {"quantization": {"quant_algo": "FP8", "exclude_modules": patterns}})
        config.packed_modules_mapping = fused
        for layer, shards in (("self_attn.qkv_proj", "qkv"), ("mlp.gate_up_proj", ("gate", "up"))):
            theirs = config.is_layer_excluded(f"model.layers.0.{layer}")
            parent = layer.split(".")[0]
            ours = [quantization.Unquantized(tuple(patterns)).excludes(
                f"model.layers.0.{parent}.{s}_proj") for s in shards]
            assert all(ours) == theirs, (patterns, layer)


# --------------------------------------------------------------- any config at all

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
_ENTRIES = st.lists(st.sampled_from(["lm_head", "*self_attn*", "model.layers.1*", "*mlp*",
                                     "model.layers.0.self_attn.qkv_proj", "re:.*mlp.*",
                                     "model.layers.*.mlp.gate", "?", "[", "*"]), max_size=4)
_LIST = _ENTRIES | _ENTRIES.map(lambda e: [*e, 3]) | _JSON


@settings(max_examples=300, deadline=None)
@given(algo=st.sampled_from(["FP8", "NVFP4", "nvfp4", "", None, 8]),
       where=st.sampled_from(["side", "ignore", "exclude_modules", "nested", "both"]),
       entries=_LIST, extra=_ENTRIES)
def test_any_exclusion_list_sizes_the_model_between_packed_and_bf16(
        algo: Any, where: str, entries: Any, extra: list[str]) -> None:
    if where == "side":
        q: dict[str, Any] = side_file(algo, entries)
    elif where == "nested":  # the block one level too deep: no list where vLLM looks
        q = {"producer": {"name": "modelopt"}, "quantization": {"quantization": {
            "quant_algo": algo, "exclude_modules": entries}}}
    else:
        q = {"quant_method": "modelopt", "quant_algo": algo,
             ("ignore" if where != "exclude_modules" else "exclude_modules"): entries}
        if where == "both":
            q["exclude_modules"] = extra
    m = sized(LLAMA, q)  # total: no exception whatever the list holds
    bf16 = sized(LLAMA, None).weight_bytes
    packed = sized(LLAMA, side_file(algo, [])).weight_bytes
    assert packed <= m.weight_bytes <= bf16
    # an entry more never makes the model smaller
    if where == "side" and isinstance(entries, list):
        more = sized(LLAMA, side_file(algo, [*entries, *extra]))
        assert more.weight_bytes >= m.weight_bytes
    # a list vLLM would refuse, or whose empty entry it finds in every name, says so and
    # sizes every layer at 16 bits
    if where in ("side", "ignore") and not (
            isinstance(entries, list) and all(isinstance(e, str) and e for e in entries)):
        assert m.notes
        assert m.weight_bytes == bf16
