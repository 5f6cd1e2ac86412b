"""loadgen's torch-free way to a local tokenizer counts exactly as AutoTokenizer does.

A directory whose tokenizer_config.json names transformers' generic TokenizersBackend is loaded
with that class directly (loadgen.tokens._generic_class), skipping AutoTokenizer's import of
torch; every other directory still goes through AutoTokenizer. The counts of the two ways are
compared on generated texts and conversations, and each reason to leave the fast path is shown
to leave it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.errors import TokenizerError
from loadgen.tokens import LocalCounter, _distrusted_model_types, _generic_class, load_tokenizer

TEXT = st.text(st.characters(codec="utf-8"), max_size=200)
MESSAGES = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                           "content": TEXT}),
    min_size=1, max_size=4,
)


@pytest.fixture(scope="module")
def both(tiny_model_path: str) -> tuple[LocalCounter, Any]:
    from transformers import AutoTokenizer

    return load_tokenizer(tiny_model_path), AutoTokenizer.from_pretrained(tiny_model_path)


def test_the_embedded_models_tokenizer_takes_the_fast_path(
    both: tuple[LocalCounter, Any]
) -> None:
    fast, auto = both
    assert _generic_class(Path(fast.name))
    assert type(fast._tok) is type(auto)  # the class AutoTokenizer picks, loaded directly


@given(text=TEXT)
def test_text_counts_are_autotokenizers(both: tuple[LocalCounter, Any], text: str) -> None:
    fast, auto = both
    assert fast.text(text) == len(auto(text)["input_ids"])
    assert fast.output(text) == (len(auto(text, add_special_tokens=False)["input_ids"])
                                 if text else 0)


@given(messages=MESSAGES)
def test_chat_counts_are_autotokenizers(
    both: tuple[LocalCounter, Any], messages: list[dict[str, str]]
) -> None:
    fast, auto = both
    ids = auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert fast.chat(messages) == len(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _copy(tiny_model_path: str, dest: Path, tok_cfg: dict[str, Any] | None = None,
          cfg: dict[str, Any] | None = None) -> Path:
    shutil.copytree(tiny_model_path, dest, ignore=shutil.ignore_patterns("*.safetensors"))
    for name, changes in (("tokenizer_config.json", tok_cfg), ("config.json", cfg)):
        if changes:
            data = json.loads((dest / name).read_text())
            (dest / name).write_text(json.dumps({**data, **changes}))
    return dest


def test_a_distrusted_model_type_a_named_class_or_remote_code_go_through_autotokenizer(
    tiny_model_path: str, tmp_path: Path
) -> None:
    distrusted = _distrusted_model_types()
    assert distrusted is not None  # read from transformers' source
    assert "qwen2" in distrusted
    assert _generic_class(_copy(tiny_model_path, tmp_path / "alias",
                                {"tokenizer_class": "PreTrainedTokenizerFast"}))
    assert not _generic_class(_copy(tiny_model_path, tmp_path / "qwen2",
                                    cfg={"model_type": "qwen2"}))
    assert not _generic_class(_copy(tiny_model_path, tmp_path / "named",
                                    {"tokenizer_class": "LlamaTokenizer"}))
    assert not _generic_class(_copy(tiny_model_path, tmp_path / "remote",
                                    {"auto_map": {"AutoTokenizer": ["x.X", None]}}))
    mistral = _copy(tiny_model_path, tmp_path / "mistral")
    (mistral / "tekken.json").write_text("{}")
    assert not _generic_class(mistral)
    no_json = _copy(tiny_model_path, tmp_path / "no-json")
    (no_json / "tokenizer.json").unlink()
    assert not _generic_class(no_json)
    broken = _copy(tiny_model_path, tmp_path / "broken")
    (broken / "config.json").write_text("{not json")
    assert not _generic_class(broken)


def test_a_missing_directory_is_a_one_line_error_before_transformers_loads(
    tmp_path: Path
) -> None:
    with pytest.raises(TokenizerError, match=r"cannot load tokenizer .*no such directory"):
        load_tokenizer(str(tmp_path / "nothing"))
