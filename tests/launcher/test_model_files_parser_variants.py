"""A model's own files as they come from the hub or a user's disk, fed generated variants:
config.json as any bytes (deep nesting included), its nested rope / sliding-window / quantization
fields damaged, the safetensors index with any ``total_size``, and the shape cache nested past
Python's recursion limit. Each sizes the model, keeps the estimate (a damaged index), or ends in
one ModelError line; never another exception."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.errors import ModelError, PlanError
from launcher.model import hfconfig
from launcher.model.modelspec import load_model_spec, spec_from_config
from launcher.planner.plan import Policy, plan
from launcher.probe.topology import load_topology
from tests.launcher.paths import MODELS, topo

LLAMA = json.loads((MODELS / "llama-3.1-8b" / "config.json").read_text())
TOPOLOGY = load_topology(topo("2x3090-nvlink-x8x8"), {})
# json nests one Python frame per level: 100,000 levels is past any recursion limit
DEEP = st.sampled_from(["[" * 100_000, '{"a":' * 100_000, "[" * 100_000 + "]" * 100_000])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 60), 1 << 60) | st.floats()
    | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=10,
)


def one_line(exc: BaseException) -> None:
    message = str(exc).strip()
    assert message
    assert "\n" not in message


def _folder(config: bytes, index: bytes | None = None) -> tempfile.TemporaryDirectory[str]:
    d = tempfile.TemporaryDirectory()
    (Path(d.name) / "config.json").write_bytes(config)
    if index is not None:
        (Path(d.name) / "model.safetensors.index.json").write_bytes(index)
    return d


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.binary(max_size=64), DEEP.map(str.encode), JSON.map(lambda v: json.dumps(v)
                                                                        .encode())))
def test_any_config_file_sizes_a_model_or_is_one_model_error(content: bytes) -> None:
    with _folder(content) as d:
        try:
            m = load_model_spec(d, {})
        except ModelError as exc:
            one_line(exc)
            return
    assert m.params > 0


def _estimate() -> int:
    with _folder(json.dumps(LLAMA).encode()) as d:
        return load_model_spec(d, {}).weight_bytes


ESTIMATE = _estimate()


@settings(max_examples=80, deadline=None)
@given(st.one_of(
    DEEP,
    st.binary(max_size=32).map(lambda b: b.decode("latin-1")),
    JSON.map(lambda v: json.dumps({"metadata": {"total_size": v}, "weight_map": {}})),
    st.integers(-5, 1 << 52).map(lambda n: json.dumps({"metadata": {"total_size": n}})),
    JSON.map(json.dumps),
))
def test_any_safetensors_index_sizes_the_model_or_leaves_the_estimate(index: str) -> None:
    with _folder(json.dumps(LLAMA).encode(), index.encode("utf-8", "surrogatepass")) as d:
        m = load_model_spec(d, {})
    # the index replaces the estimate only with a size that can hold the weights it counts
    assert m.params > 0
    assert m.weight_bytes * 8 >= m.params or m.weight_bytes == ESTIMATE


def test_an_index_of_one_byte_leaves_the_estimate() -> None:
    # found here: total_size 1 sized Llama-3.1-8B as 0 parameters and 0 weight bytes
    with _folder(json.dumps(LLAMA).encode(), b'{"metadata": {"total_size": 1}}') as d:
        assert load_model_spec(d, {}).weight_bytes == ESTIMATE


def test_a_config_nested_past_the_recursion_limit_is_one_model_error() -> None:
    # found here: json's RecursionError went past the except of ValueError as a traceback
    with _folder(b"[" * 100_000) as d, pytest.raises(ModelError, match=r"config\.json"):
        load_model_spec(d, {})


# The nested fields that carry rope scaling, sliding windows and quantization, per fixture.
_NESTED = ("rope_scaling", "rope_parameters", "quantization_config", "layer_types",
           "sliding_window", "sliding_window_pattern", "use_sliding_window", "max_window_layers")
CONFIGS = {p.parent.name: json.loads(p.read_text()) for p in sorted(MODELS.glob("*/config.json"))}
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 1 << 40), st.floats(),
                    st.text(max_size=6), st.lists(st.sampled_from(
                        ["full_attention", "sliding_attention", "x", 1, None]), max_size=70))


@st.composite
def nested_damage(draw: st.DrawFn) -> dict[str, Any]:
    cfg = json.loads(json.dumps(CONFIGS[draw(st.sampled_from(sorted(CONFIGS)))]))
    where = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
    key = draw(st.sampled_from(_NESTED))
    inner = where.get(key)
    if isinstance(inner, dict) and inner and draw(st.booleans()):
        inner[draw(st.sampled_from(sorted(inner)))] = draw(_VALUES)  # inside the nested dict
    elif isinstance(inner, list) and inner and draw(st.booleans()):
        inner[draw(st.integers(0, len(inner) - 1))] = draw(_VALUES)  # one layer's type
    else:
        where[key] = draw(st.one_of(_VALUES, st.dictionaries(
            st.sampled_from(["factor", "rope_type", "type", "quant_method", "bits",
                             "original_max_position_embeddings", "rope_theta"]),
            _VALUES, max_size=3)))
    return cfg


# each builds its model through transformers and plans it (~0.1 s on CI's two cores)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nested_damage())
def test_damaged_rope_window_and_quantization_fields_plan_or_are_one_line(
        cfg: dict[str, Any]) -> None:
    try:
        m = spec_from_config(cfg, "damaged")
        plan(TOPOLOGY, m, Policy())
    except (ModelError, PlanError) as exc:
        one_line(exc)


@pytest.fixture
def shape_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TOPOSERVE_CACHE", str(tmp_path))
    hfconfig._shape.cache_clear()
    return tmp_path


def test_a_shape_cache_file_nested_past_the_recursion_limit_is_counted_again(
        shape_cache: Path) -> None:
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 512, "max_position_embeddings": 2048}
    counted = hfconfig.shape(config)
    assert counted is not None
    [path] = list(shape_cache.rglob("*.json"))
    path.write_text("[" * 100_000)
    hfconfig._shape.cache_clear()
    assert hfconfig.shape(config) == counted
