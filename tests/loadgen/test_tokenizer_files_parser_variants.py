"""The files of a --tokenizer folder that loadgen reads itself before AutoTokenizer does
(tokenizer_config.json and config.json, to pick transformers' generic fast class), fed any bytes,
JSON nested past Python's recursion limit included: the answer is True or False (False: leave it
to AutoTokenizer, whose failure is one TokenizerError line); never an exception."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.tokens import _generic_class

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5)
    | st.sampled_from(["TokenizersBackend", "PreTrainedTokenizerFast", "llama", "auto_map"]),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(
        st.sampled_from(["tokenizer_class", "model_type", "auto_map", "x"]), c, max_size=3),
    max_leaves=8,
)
FILES = st.one_of(st.binary(max_size=30), st.sampled_from([b"[" * 100_000, b'{"a":' * 100_000]),
                  JSON.map(lambda v: json.dumps(v).encode()))


@settings(max_examples=150, deadline=None)
@given(tok_cfg=FILES, model_cfg=st.one_of(st.none(), FILES), tokenizer_json=st.booleans())
def test_any_tokenizer_folder_files_give_a_yes_or_no(
        tok_cfg: bytes, model_cfg: bytes | None, tokenizer_json: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "tokenizer_config.json").write_bytes(tok_cfg)
        if model_cfg is not None:
            (folder / "config.json").write_bytes(model_cfg)
        if tokenizer_json:
            (folder / "tokenizer.json").write_text("{}")
        assert _generic_class(folder) in (True, False)


def test_a_tokenizer_config_nested_past_the_recursion_limit_is_left_to_autotokenizer(
        tmp_path: Path) -> None:
    # found here: json's RecursionError went past `except (OSError, ValueError)`
    (tmp_path / "tokenizer_config.json").write_bytes(b"[" * 100_000)
    assert _generic_class(tmp_path) is False
