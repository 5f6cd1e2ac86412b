"""Model sizing from config.json, table-driven over real configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.errors import ModelError
from launcher.model.modelspec import GIB, load_model_spec, spec_from_config
from tests.launcher.paths import model

# name, family, params (billions, published), weight GiB, KV bytes/token at 8k, sliding layers
CASES = [
    ("llama-3.3-70b", "llama", 70.6, 131.4, 327680, 0),
    # 4-bit AWQ as vLLM holds it on Hopper: the checkpoint's 37.0 GiB and 1.02 of repacking
    # (Machete's 16-bit zero points 0.75, allocator blocks 0.27: quantization.awq_load_growth)
    ("llama-3.3-70b-awq", "llama", 70.6, 38.1, 327680, 0),
    ("qwen2.5-32b", "qwen2", 32.8, 61.0, 262144, 0),
    ("gemma-3-27b", "gemma3", 27.4, 51.1, 135168, 52),
    ("gemma-2-27b", "gemma2", 27.2, 50.7, 282624, 23),  # every other layer local, 4096 window
    ("mistral-7b", "mistral", 7.25, 13.5, 131072, 0),
    ("qwen3-32b", "qwen3", 32.8, 61.0, 262144, 0),
    ("qwen3-30b-a3b", "qwen3", 30.5, 56.9, 98304, 0),
    ("mixtral-8x7b", "mistral", 46.7, 87.0, 131072, 0),
    # MLA: one latent vector of 512 + 64 per token and layer (27 layers, 16 bits)
    ("deepseek-v2-lite", "deepseek", 15.7, 29.3, 27 * 576 * 2, 0),
    # MXFP4 experts (4.25 bits), the rest 16-bit: gpt-oss-20b's checkpoint is 13.8 GB
    ("gpt-oss-20b", "gpt_oss", 20.9, 12.8, 24960, 12),
]


@pytest.mark.parametrize(("name", "family", "params_b", "weights_gib", "kv8k", "sliding"), CASES)
def test_sizes_real_configs(
    name: str, family: str, params_b: float, weights_gib: float, kv8k: int, sliding: int
) -> None:
    m = load_model_spec(model(name))
    assert m.family == family
    assert m.params / 1e9 == pytest.approx(params_b, rel=0.01)
    assert m.weight_bytes / GIB == pytest.approx(weights_gib, abs=0.1)
    assert m.kv_bytes_per_token(8192) == pytest.approx(kv8k)
    assert m.sliding_layers == sliding


def test_gemma3_reads_the_nested_text_config_and_its_defaults() -> None:
    m = load_model_spec(model("gemma-3-27b"))
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim) == (
        62,
        5376,
        32,
        16,
        128,
    )
    assert m.vocab_size == 262208
    assert m.max_position_embeddings == 131072
    assert m.sliding_window == 1024


def test_a_sliding_window_model_is_described_as_sliding_not_chunked() -> None:
    from launcher.planner.explain import describe_model

    m = load_model_spec(model("gemma-3-27b"))
    assert describe_model(m).endswith(", 52 sliding-window layers (1024 tokens)")
    assert (m.chunked_layers, m.attention_chunk) == (0, None)
    assert not any(g.chunked for g in m.kv_groups)


def test_sliding_layers_keep_only_their_window() -> None:
    m = load_model_spec(model("gemma-3-27b"))
    per = m.kv_bytes_per_layer_token()
    assert m.kv_bytes(512) == per * 62 * 512
    assert m.kv_bytes(32768) == per * (10 * 32768 + 52 * 1024)
    # the inverse: the longest sequence a budget holds
    assert m.tokens_fitting(m.kv_bytes(32768)) == 32768
    assert m.tokens_fitting(m.kv_bytes(700)) == 700


def test_awq_weights_are_a_quarter_plus_scales_and_16_bit_tables() -> None:
    bf16 = load_model_spec(model("llama-3.3-70b"))
    awq = load_model_spec(model("llama-3.3-70b-awq"))
    assert (awq.quantization, awq.weight_bits, awq.dtype) == ("awq", 4.0, "float16")
    assert 0.27 < awq.weight_bytes / bf16.weight_bytes < 0.30


def test_mixture_of_experts_counts_active_parameters() -> None:
    m = load_model_spec(model("qwen3-30b-a3b"))
    assert m.active_params / 1e9 == pytest.approx(3.3, abs=0.1)
    assert m.num_experts == 128


def test_fp8_config() -> None:
    cfg = json.loads(Path(model("llama-3.3-70b"), "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    m = spec_from_config(cfg, "fp8")
    assert m.quantization == "fp8"
    assert 67 < m.weight_bytes / GIB < 69  # the published FP8 checkpoint is ~72 GB


def test_finds_a_model_in_the_hub_cache_offline(tmp_path: Path) -> None:
    snap = tmp_path / "models--meta-llama--Llama-3.3-70B-Instruct" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(Path(model("llama-3.3-70b"), "config.json").read_text())
    (tmp_path / "models--meta-llama--Llama-3.3-70B-Instruct" / "refs").mkdir()
    (tmp_path / "models--meta-llama--Llama-3.3-70B-Instruct" / "refs" / "main").write_text("abc123")
    env = {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}  # online: tests/launcher/test_hub
    m = load_model_spec("meta-llama/Llama-3.3-70B-Instruct", env)
    assert m.name == "meta-llama/Llama-3.3-70B-Instruct"
    assert m.num_layers == 80


def test_a_model_not_found_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"HF_HUB_OFFLINE is set and org/missing .* cache"):
        load_model_spec("org/missing", {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"})


def test_a_config_without_layers_is_a_model_error() -> None:
    with pytest.raises(ModelError, match="num_hidden_layers"):
        spec_from_config({"model_type": "bert", "hidden_size": 8}, "x")


def test_the_embedded_tiny_model_sizes(tiny_model_path: str) -> None:
    m = load_model_spec(tiny_model_path)
    assert (m.hidden_size, m.num_layers) == (256, 4)
    assert m.weight_bytes > 0


# ---------------------------------------------- issue 14: read as transformers defines them

# name, family, params (billions, published), active (billions), KV bytes/token at 8k
FAMILY_CASES = [
    ("llama-3.1-8b", "llama", 8.03, 8.03, 131072),
    ("llama-3.2-3b", "llama", 3.21, 3.21, 114688),  # tied LM head
    ("mistral-small-24b", "mistral", 23.6, 23.6, 163840),
    ("qwen2-57b-a14b", "qwen2", 57.4, 14.2, 57344),  # shared expert beside 64 routed
    # Gemma 4: 50 sliding layers of 16 KV heads x 256, 10 global of 4 x 512 whose keys are
    # their values (the value slot still holds a copy in vLLM)
    ("gemma-4-31b", "gemma4", 30.7, 30.7, 184320),
    ("gemma-4-26b-a4b", "gemma4", 25.2, 3.8, 46080),  # 128 experts, top 8, beside a dense MLP
]


@pytest.mark.parametrize(("name", "family", "params_b", "active_b", "kv8k"), FAMILY_CASES)
def test_sizes_every_family_through_its_transformers_config_class(
    name: str, family: str, params_b: float, active_b: float, kv8k: int
) -> None:
    m = load_model_spec(model(name))
    assert m.family == family
    assert m.params / 1e9 == pytest.approx(params_b, rel=0.01)
    assert m.active_params / 1e9 == pytest.approx(active_b, rel=0.02)
    assert m.kv_bytes_per_token(8192) == pytest.approx(kv8k)


def test_gemma4_layer_types_differ_in_kv_shape() -> None:
    m = load_model_spec(model("gemma-4-31b"))
    by_window = {g.window: (g.layers, g.kv_heads, g.head_dim) for g in m.kv_groups}
    assert by_window == {1024: (50, 16, 256), None: (10, 4, 512)}


def test_gemma4_shared_kv_layers_hold_no_cache() -> None:
    cfg = json.loads(Path(model("gemma-4-31b"), "config.json").read_text())
    cfg["text_config"] = {**cfg["text_config"], "num_kv_shared_layers": 12}
    m = spec_from_config(cfg, "shared")
    assert sum(g.layers for g in m.kv_groups) == 48  # the last 12 reuse earlier layers' KV


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(-2, 200),
    hidden=st.sampled_from([0, 7, 64, 256, 4096, "x", None]),
    heads=st.sampled_from([0, 1, 3, 4, 32, None]),
    kv=st.sampled_from([0, 1, 2, 8, 64, None]),
    model_type=st.sampled_from(["llama", "qwen2", "gemma3_text", "gemma4_text", "nope", ""]),
)
def test_generated_configs_size_or_fail_with_a_model_error(
    layers: int, hidden: object, heads: object, kv: object, model_type: str
) -> None:
    cfg = {
        "model_type": model_type,
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": 512,
        "intermediate_size": 128,
    }
    try:
        m = spec_from_config(cfg, "generated")
    except ModelError:
        return
    assert m.params >= 0
    assert m.weight_bytes >= 0


def test_latent_attention_is_one_cache_replicated_over_tensor_parallel_ranks() -> None:
    from launcher.planner import memfit

    m = load_model_spec(model("deepseek-v2-lite"))
    assert [g.latent for g in m.kv_groups] == [True]
    # vLLM keeps the whole latent cache on every TP rank: TP=2 does not halve it
    assert memfit.kv_shards(m, 2, 1) == 1
    assert memfit.kv_shards(m, 1, 2) == pytest.approx(27 / 14)  # PP splits layers 14/13


def test_latent_attention_is_read_from_config_fields_when_transformers_cannot_build_it() -> None:
    cfg = json.loads(Path(model("deepseek-v2-lite"), "config.json").read_text())
    cfg["model_type"] = "deepseek_v2_unknown_to_transformers"
    m = spec_from_config(cfg, "unknown-mla")
    assert m.kv_bytes_per_token(8192) == 27 * 576 * 2


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 1 << 40) | st.floats() | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=10), c, max_size=4),
    max_leaves=10)


# A group size, a bit width, a ModelOpt algorithm: real ones (drawn twice as often, so that
# most configs reach the arithmetic), and the wrong types and hostile values a damaged or
# hand-written config holds (0, negatives, fractions, NaN, infinities, strings, booleans)
def _real_or_hostile(real: list[object], hostile: list[object]) -> st.SearchStrategy[object]:
    return st.one_of(st.sampled_from(real), st.sampled_from(real),
                     st.sampled_from(hostile) | _JSON)


_SIZE = _real_or_hostile([-1, 1, 2, 16, 32, 64, 128, 4096],
                         [0, -7, 1 << 30, 0.5, 1.5, 16.0, True, float("nan"), float("inf"),
                          "128", None])
_BITS = _real_or_hostile([2, 3, 4, 8, 16], [0, 1, -4, 3.5, 32, float("nan"), "4", True, None])
_ALGO = _real_or_hostile(["FP8", "NVFP4", "MIXED_PRECISION", "W4A16_NVFP4", "MXFP8",
                          "FP8_PB_WO", "INT4_AWQ", "W4A8_AWQ"], ["fp8", "", None, 4])
_MODULES = st.lists(st.sampled_from(["lm_head", "re:.*self_attn.*", "*self_attn*", "model.*",
                                     "re:.*mlp.gate$", ""]), max_size=3) | _JSON


def _maybe(**fields: st.SearchStrategy[object]) -> st.SearchStrategy[dict[str, object]]:
    """A dict holding any subset of ``fields``, each drawn from its strategy."""
    return st.fixed_dictionaries({}, optional=fields)


def _or_junk(shape: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """``shape`` mostly, any JSON value in its place now and then."""
    return st.one_of(shape, shape, shape, _JSON)


# ModelOpt's own fields (hf_quant_config.json's ``producer`` and ``quantization`` block, or
# ModelOpt 0.31's copy inside config.json), and compressed-tensors' ``ignore`` and config groups
_LAYERS = _or_junk(st.dictionaries(st.text(max_size=12),
                                   _or_junk(_maybe(quant_algo=_ALGO, group_size=_SIZE)),
                                   min_size=1, max_size=3))
_MODELOPT = _or_junk(st.fixed_dictionaries(
    {"quant_algo": _ALGO}, optional={"kv_cache_quant_algo": _ALGO, "group_size": _SIZE,
                                     "exclude_modules": _MODULES, "quantized_layers": _LAYERS}))
_PRODUCER = _or_junk(st.fixed_dictionaries(
    {"name": st.sampled_from(["modelopt", "modelopt", "llmcompressor"]) | _JSON},
    optional={"version": _JSON}))
_WEIGHTS = _or_junk(st.fixed_dictionaries(
    {"num_bits": _BITS,
     "strategy": _real_or_hostile(["group", "group", "channel", "tensor", "tensor_group",
                                   "block"],
                                  ["token", "GROUP", None])},
    optional={"group_size": _SIZE, "symmetric": st.booleans() | _JSON,
              "type": st.sampled_from(["int", "float"]) | _JSON,
              "scale_dtype": _real_or_hostile(["torch.float8_e4m3fn", "torch.uint8",
                                               "torch.bfloat16", "torch.float32"],
                                              ["float32", "torch.", None])}))
_GROUPS = _or_junk(st.dictionaries(st.text(max_size=8),
                                   _or_junk(st.fixed_dictionaries(
                                       {"weights": _WEIGHTS}, optional={"targets": _MODULES})),
                                   min_size=1, max_size=3))


def _group_sizes(value: object) -> list[float]:
    """Every number a config names as a group size, anywhere in it."""
    found: list[float] = []
    if isinstance(value, dict):
        for key, inner in value.items():
            if (key in ("group_size", "q_group_size") and isinstance(inner, (int, float))
                    and not isinstance(inner, bool)):
                found.append(inner)
            found += _group_sizes(inner)
    elif isinstance(value, list):
        for inner in value:
            found += _group_sizes(inner)
    return found


def _largest_bytes_per_bf16_byte(q: dict[str, object]) -> float:
    """What a quantized weight can take at most, over its 16-bit size, from the drawn scheme's
    own mechanism: at most 16 bits of value, and per group of G weights at most a scale (16
    bits, or 32 where the config names a float32 one) and a 16-bit zero point:
    (2 + (scale + 2) / G) / 2 bytes, G the smallest group size the config names (a whole
    number of weights), else the readers' default of 128 weights a group. A config of
    one-weight groups is rightly larger than bf16: its checkpoint holds a scale per weight."""
    groups = [g for g in _group_sizes(q) if 1 <= g < float("inf") and g == int(g)]
    scale = 4 if "float32" in json.dumps(q) else 2
    return 1 + (scale + 2) / 2 / min([*groups, 128])


@settings(max_examples=500, deadline=None)
@given(method=st.sampled_from(["awq", "gptq", "gptq_marlin", "fp8", "fbgemm_fp8", "mxfp4",
                               "modelopt", "bitsandbytes", "compressed-tensors", "hqq", "",
                               None]),
       fields=_maybe(bits=_BITS, w_bit=_BITS, group_size=_SIZE, q_group_size=_SIZE,
                     quant_algo=_ALGO, kv_cache_quant_algo=_ALGO, load_in_4bit=_JSON,
                     config_groups=_GROUPS, ignore=_MODULES, weights=_WEIGHTS, num_bits=_BITS,
                     producer=_PRODUCER, quantization=_MODELOPT,
                     quantized_layers=_MODELOPT, exclude_modules=_MODULES))
def test_any_quantization_config_sizes_the_model(method: str | None,
                                                 fields: dict[str, object]) -> None:
    # method None: no quant_method, as ModelOpt's hf_quant_config.json (its producer names it)
    cfg = json.loads(Path(model("llama-3.1-8b"), "config.json").read_text())
    q = {**fields} if method is None else {"quant_method": method, **fields}
    cfg["quantization_config"] = q
    m = spec_from_config(cfg, "generated-quantization")  # the reader is total: no exception
    bf16 = spec_from_config({**cfg, "quantization_config": None}, "bf16").weight_bytes
    assert 1 <= m.weight_bits <= 16
    assert bf16 / 16 <= m.weight_bytes <= bf16 * _largest_bytes_per_bf16_byte(q)


def test_nvfp4_and_fp8_modelopt_checkpoints_are_4_and_8_bit() -> None:
    cfg = json.loads(Path(model("llama-3.1-8b"), "config.json").read_text())
    fp4 = spec_from_config({**cfg, "quantization_config": {"quant_method": "modelopt",
                                                           "quant_algo": "NVFP4"}}, "fp4")
    fp8 = spec_from_config({**cfg, "quantization_config": {"quant_method": "modelopt",
                                                           "quant_algo": "FP8"}}, "fp8")
    assert (fp4.weight_bits, fp8.weight_bits) == (4.0, 8.0)
    assert fp4.weight_bytes < fp8.weight_bytes


# compressed-tensors 0.17's presets as a checkpoint's config_groups write them
# (preset_name_to_scheme(name, ["Linear"]).weights.model_dump(mode="json"), less the observer)
_NVFP4A16 = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16,
             "strategy": "tensor_group", "scale_dtype": "torch.float8_e4m3fn", "zp_dtype": None}
_W4A16 = {"num_bits": 4, "type": "int", "symmetric": True, "group_size": 128,
          "strategy": "group", "scale_dtype": None, "zp_dtype": None}
_W8_CHANNEL = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}


def _compressed(*weights: dict[str, object]) -> tuple[str | None, float, float]:
    from launcher.model import quantization

    groups = {f"group_{i}": {"targets": ["Linear"], "weights": w} for i, w in enumerate(weights)}
    q = {"quant_method": "compressed-tensors", "format": "pack-quantized",
         "config_groups": groups}
    return quantization.read({"quantization_config": q}, {})


def test_a_compressed_tensors_nvfp4_checkpoint_counts_an_fp8_scale_per_16_weights() -> None:
    # NVFP4's strategy is tensor_group (a scale per 16 weights, and one per tensor), its scales
    # FP8: half a byte and a sixteenth a weight, as ModelOpt's NVFP4 export
    assert _compressed(_NVFP4A16) == ("compressed-tensors", 4.0, 1 / 16)
    assert _compressed(_W4A16) == ("compressed-tensors", 4.0, 2 / 128)  # 16-bit scales


def test_a_compressed_tensors_checkpoint_of_several_schemes_is_sized_at_its_widest() -> None:
    # which layers each group targets is not counted, so every layer is taken at the widest
    # group's bytes (ModelOpt's MIXED_PRECISION is read the same way), whatever their order
    assert _compressed(_W8_CHANNEL, _W4A16) == ("compressed-tensors", 8.0, 0.0)
    assert _compressed(_W4A16, _W8_CHANNEL) == ("compressed-tensors", 8.0, 0.0)
    small = {**_W4A16, "group_size": 32}
    assert _compressed(small, _W4A16) == _compressed(_W4A16, small) == (
        "compressed-tensors", 4.0, 2 / 32)


def test_a_one_file_checkpoint_is_sized_by_its_own_bytes(tmp_path: Path) -> None:
    # No index beside model.safetensors (most checkpoints under ~5 GB): the file less its
    # header is the weights, here an AWQ checkpoint a little larger than the estimate; vLLM
    # holds it with its repacking's growth (load_growth_bytes) as it would the estimate.
    import json as _json

    cfg = _json.loads(Path(model("llama-3.3-70b-awq"), "config.json").read_text())
    (tmp_path / "config.json").write_text(_json.dumps(cfg))
    sized = load_model_spec(str(tmp_path))
    header = b'{"__metadata__":{"format":"pt"}}'
    tensors = sized.weight_bytes - sized.load_growth_bytes + 12345
    with (tmp_path / "model.safetensors").open("wb") as fh:
        fh.write(len(header).to_bytes(8, "little") + header)
        fh.seek(8 + len(header) + tensors - 1)
        fh.write(b"\0")  # sparse: the size is what counts
    assert load_model_spec(str(tmp_path)).weight_bytes == tensors + sized.load_growth_bytes


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64))
def test_any_model_safetensors_file_is_read_or_ignored(content: bytes) -> None:
    import tempfile

    from launcher.model import hub

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.safetensors"
        path.write_bytes(content)
        got = hub.single_file_bytes(path)
        assert got is None or 0 < got < len(content)


def test_gemma_3n_sizes_from_its_language_model_when_a_tower_cannot_be_built(
        tmp_path: Path) -> None:
    # Gemma 3n's vision tower is timm's, which this environment does not install; its text
    # config also gives one MLP width per layer (a list), which the field reader must take.
    import transformers

    transformers.Gemma3nConfig().save_pretrained(tmp_path)
    m = load_model_spec(str(tmp_path), {})
    assert m.family == "gemma3n"
    assert 6e9 < m.params < 9e9  # E4B at its class defaults: 6.8B with per-layer embeddings
    assert m.intermediate_size == 16384
    # 20 of its 35 layers hold KV; the last 15 reuse it (shared KV), 4 of 20 are full attention
    assert sum(g.layers for g in m.kv_groups) == 20
    assert sum(g.layers for g in m.kv_groups if g.window is None) == 4
