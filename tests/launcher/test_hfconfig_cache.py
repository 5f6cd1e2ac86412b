"""The disk cache of model shapes (launcher/model/hfconfig.py): a plan of a model counted once reads
its shape back without torch or transformers, and a cache file that is damaged, foreign or
unwritable only costs the count again, never a wrong shape or an error."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.model import hfconfig

CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 2048,
          "tie_word_embeddings": False}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TOPOSERVE_CACHE", str(tmp_path))
    hfconfig._shape.cache_clear()
    return tmp_path / "shapes"


def counted() -> hfconfig.HfShape:
    found = hfconfig._shape.__wrapped__(_key())
    assert found is not None
    return found


def _key() -> str:
    return json.dumps(CONFIG, sort_keys=True, default=str)


def test_a_shape_counted_once_is_read_back_without_counting(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = hfconfig.shape(CONFIG)
    assert first is not None
    assert len(list(cache.glob("*.json"))) == 1

    def no_count(key: str) -> Any:
        raise AssertionError("counted again although the cache holds the shape")

    monkeypatch.setattr(hfconfig, "_shape", no_count)
    assert hfconfig.shape(CONFIG) == first


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                              lambda c: st.lists(c, max_size=3)
                              | st.dictionaries(st.text(max_size=8), c, max_size=4),
                              max_leaves=12).map(json.dumps)))
def test_a_damaged_cache_file_gives_the_counted_shape(cache: Path, content: str) -> None:
    path = hfconfig._cache_file(_key())
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    assert hfconfig.shape(CONFIG) == counted()


def test_an_unwritable_cache_still_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    monkeypatch.setenv("TOPOSERVE_CACHE", str(blocked))  # shapes/ cannot be made under a file
    hfconfig._shape.cache_clear()
    assert hfconfig.shape(CONFIG) == counted()


def test_another_transformers_version_does_not_read_the_old_answer(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = hfconfig._cache_file(_key())
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.0-other")
    hfconfig._transformers_version.cache_clear()  # looked up once a process
    try:
        assert hfconfig._cache_file(_key()) != before
    finally:
        hfconfig._transformers_version.cache_clear()  # the real one again, once unpatched


def test_a_quantized_checkpoint_reads_the_count_of_its_bf16_config(cache: Path) -> None:
    # the shape is counted as bf16 whatever the quantization: one count, one file, for both
    plain = hfconfig.shape(CONFIG)
    files = sorted(cache.iterdir())
    assert len(files) == 1
    hfconfig._shape.cache_clear()
    awq = hfconfig.shape({**CONFIG, "quantization_config": {"quant_method": "awq", "bits": 4}})
    assert awq == plain
    assert sorted(cache.iterdir()) == files
    assert hfconfig._shape.cache_info().misses == 0  # read back, not counted again
