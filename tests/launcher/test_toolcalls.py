"""The tool-call parser is turned on only when the model's tokenizer can serve it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.model.toolcalls import (
    FAMILY_PARSERS,
    chat_template,
    choose_tool_parser,
    lacks_chat_template,
    tokenizer_tokens,
)


def _write(root: Path, name: str, data: object) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(json.dumps(data), encoding="utf-8")


def test_llama_parser_is_off_when_the_tokenizer_lacks_its_bot_token() -> None:
    parser, note = choose_tool_parser("llama", frozenset({"hello", "<|eot_id|>"}))
    assert parser is None
    assert note is not None
    assert "<|python_tag|>" in note
    assert "--tool-call-parser" in note


def test_llama_parser_is_on_when_the_bot_token_is_there() -> None:
    assert choose_tool_parser("llama", frozenset({"<|python_tag|>"})) == ("llama3_json", None)


def test_an_unreadable_tokenizer_keeps_the_familys_parser() -> None:
    assert choose_tool_parser("qwen3", None) == ("hermes", None)


def test_an_unknown_family_gets_no_parser_and_says_so() -> None:
    parser, note = choose_tool_parser("someformer", frozenset())
    assert parser is None
    assert note is not None
    assert "someformer" in note


def test_gemma4_gets_vllms_gemma4_parser() -> None:
    assert FAMILY_PARSERS["gemma4"] == "gemma4"


def test_tokens_are_read_from_added_tokens_vocab_and_the_config(tmp_path: Path) -> None:
    _write(tmp_path, "tokenizer.json", {
        "added_tokens": [{"id": 5, "content": "<|python_tag|>"}],
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}},
    })
    _write(tmp_path, "tokenizer_config.json",
           {"added_tokens_decoder": {"7": {"content": "[TOOL_CALLS]"}}})
    assert tokenizer_tokens(tmp_path) == frozenset({"<|python_tag|>", "a", "b", "[TOOL_CALLS]"})


def test_a_unigram_vocab_of_pairs_is_read(tmp_path: Path) -> None:
    _write(tmp_path, "tokenizer.json", {"model": {"type": "Unigram", "vocab": [["x", -1.0]]}})
    assert tokenizer_tokens(tmp_path) == frozenset({"x"})


def test_a_folder_without_tokenizer_files_is_unknown(tmp_path: Path) -> None:
    assert tokenizer_tokens(tmp_path) is None
    assert tokenizer_tokens(tmp_path / "absent") is None
    assert tokenizer_tokens(None) is None


def test_the_embedded_model_keeps_the_llama_parser(tiny_model_path: str) -> None:
    assert choose_tool_parser("llama", tokenizer_tokens(tiny_model_path))[0] == "llama3_json"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_shaped = st.fixed_dictionaries({}, optional={
    "added_tokens": st.lists(st.dictionaries(st.sampled_from(["content", "id"]), _json) | _json),
    "model": st.fixed_dictionaries({}, optional={"vocab": _json}) | _json,
    "added_tokens_decoder": st.dictionaries(st.text(max_size=4), _json) | _json,
})


@settings(max_examples=200, deadline=None)
@given(tok=_shaped | _json, cfg=_shaped | _json, raw=st.binary(max_size=40))
def test_any_tokenizer_files_give_a_token_set_or_unknown_never_an_error(
    tok: object, cfg: object, raw: bytes
) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        _write(root, "tokenizer.json", tok)
        (root / "tokenizer_config.json").write_bytes(raw if raw[:1] == b"\xff" else
                                                     json.dumps(cfg).encode())
        tokens = tokenizer_tokens(root)
        assert tokens is None or all(isinstance(t, str) for t in tokens)
        choose_tool_parser("llama", tokens)


def _plan_argv(model_dir: Path, capsys: object) -> list[str]:
    from launcher.cli.main import main
    from tests.launcher.paths import topo

    assert main(["plan", "--model", str(model_dir), "--topology", topo("h200x2-nvlink"),
                 "--json"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    return list(json.loads(out)["argv"])


def test_plan_turns_the_parser_off_for_a_tokenizer_without_its_marker(
    tmp_path: Path, capsys: object
) -> None:
    from tests.launcher.paths import model

    (tmp_path / "config.json").write_text(Path(model("llama-3.3-70b"), "config.json").read_text())
    _write(tmp_path, "tokenizer_config.json",
           {"added_tokens_decoder": {"1": {"content": "<|begin_of_text|>"}}})
    argv = _plan_argv(tmp_path, capsys)
    assert "--tool-call-parser" not in argv
    assert "--enable-auto-tool-choice" not in argv


def test_plan_keeps_the_parser_when_the_marker_is_there(tmp_path: Path, capsys: object) -> None:
    from tests.launcher.paths import model

    (tmp_path / "config.json").write_text(Path(model("llama-3.3-70b"), "config.json").read_text())
    _write(tmp_path, "tokenizer_config.json",
           {"added_tokens_decoder": {"9": {"content": "<|python_tag|>"}}})
    argv = _plan_argv(tmp_path, capsys)
    assert argv[argv.index("--tool-call-parser") + 1] == "llama3_json"


# What each family's published chat template writes around a tool call (abridged to the lines
# that carry the markers).
QWEN3_CODER = ("{%- for tool_call in message.tool_calls %}{{- '<tool_call>\\n<function=' + "
               "tool_call.name + '>\\n' }}{%- for k, v in args.items() %}{{- '<parameter=' + k "
               "+ '>\\n' }}{{- '</parameter>\\n' }}{%- endfor %}"
               "{{- '</function>\\n</tool_call>' }}")
HERMES_3 = ("{{- '<tool_call>\\n' }}{{- '{\"name\": \"' + tool_call.name + '\"' }}"
            "<|start_header_id|>assistant<|end_header_id|>")
GLM_45 = "<tool_call>{{ tc.name }}\\n{% for k, v in _args.items() %}<arg_key>{{ k }}</arg_key>"
GPT_OSS = "{{- '<|start|>assistant<|channel|>commentary to=functions.' + tool_call.name }}"


@pytest.mark.parametrize(("template", "family", "parser"), [
    (QWEN3_CODER, "qwen3", "qwen3_coder"),  # a qwen3_moe that writes XML, not Qwen3's JSON
    (HERMES_3, "llama", "hermes"),  # a Llama fine-tune that writes Hermes' <tool_call>
    (GLM_45, "glm4_moe", "glm45"),
    (GPT_OSS, "gpt_oss", "openai"),
    ("{{ '<|tool_calls_section_begin|>' }}", "kimi_k2", "kimi_k2"),
    ("{{ '[TOOL_CALLS]' + tool_calls|tojson }}", "mistral", "mistral"),
    ("{{ message.content }}", "qwen3", "hermes"),  # no markers: the family decides
    ("{{ message.content }}", "someformer", None),
])
def test_the_chat_template_names_the_tool_call_format(
        template: str, family: str, parser: str | None) -> None:
    assert choose_tool_parser(family, None, template)[0] == parser


def test_the_template_is_read_from_its_file_or_the_tokenizer_config(tmp_path: Path) -> None:
    assert chat_template(tmp_path) is None
    _write(tmp_path, "tokenizer_config.json", {"chat_template": GLM_45})
    assert chat_template(tmp_path) == GLM_45
    _write(tmp_path, "tokenizer_config.json", {"chat_template": [
        {"name": "default", "template": "plain"}, {"name": "tool_use", "template": HERMES_3}]})
    assert chat_template(tmp_path) == HERMES_3  # the one written for tool use
    (tmp_path / "chat_template.jinja").write_text(QWEN3_CODER)  # transformers' newer layout
    assert chat_template(tmp_path) == QWEN3_CODER


@settings(max_examples=100)
@given(cfg=_json, raw=st.binary(max_size=40))
def test_any_tokenizer_config_gives_a_template_or_none(cfg: object, raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for data in ({"chat_template": cfg}, cfg):
            _write(root, "tokenizer_config.json", data)
            t = chat_template(root)
            assert t is None or isinstance(t, str)
        (root / "tokenizer_config.json").write_bytes(raw)
        assert chat_template(root) is None or isinstance(chat_template(root), str)


def test_plan_serves_qwen3_coder_with_its_own_parser(tmp_path: Path, capsys: object) -> None:
    from tests.launcher.paths import model

    (tmp_path / "config.json").write_text(Path(model("qwen3-30b-a3b"), "config.json").read_text())
    _write(tmp_path, "tokenizer_config.json", {"chat_template": QWEN3_CODER})
    argv = _plan_argv(tmp_path, capsys)
    assert argv[argv.index("--tool-call-parser") + 1] == "qwen3_coder"


def test_a_base_model_is_known_to_lack_a_chat_template_only_with_its_whole_tokenizer(
    tmp_path: Path,
) -> None:
    """A hub model's planning fetch has tokenizer_config.json without tokenizer.json: its
    template may be in a file not fetched, so nothing is said; a whole local tokenizer with no
    template in any file vLLM reads is a base model."""
    _write(tmp_path, "tokenizer_config.json", {"bos_token": "<s>"})
    assert not lacks_chat_template(tmp_path)  # not sure: no tokenizer.json
    _write(tmp_path, "tokenizer.json", {"model": {}})
    assert lacks_chat_template(tmp_path)
    _write(tmp_path, "chat_template.json", {"chat_template": "{{ messages }}"})  # a processor's
    assert not lacks_chat_template(tmp_path)
    (tmp_path / "chat_template.json").unlink()
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    assert not lacks_chat_template(tmp_path)
    assert not lacks_chat_template(None)


def test_plan_says_a_base_model_will_refuse_an_agents_chat_requests_unless_given_a_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from launcher.cli.main import main
    from tests.launcher.paths import model, topo

    (tmp_path / "config.json").write_text(Path(model("llama-3.1-8b"), "config.json").read_text())
    _write(tmp_path, "tokenizer.json", {"model": {}})
    _write(tmp_path, "tokenizer_config.json", {"bos_token": "<|begin_of_text|>"})
    args = ["plan", "--model", str(tmp_path), "--topology", topo("h200x2-nvlink")]
    assert main(args) == 0
    assert "no chat template: vLLM will serve completions only" in capsys.readouterr().out
    assert main([*args, "--", "--chat-template", "/t.jinja"]) == 0
    assert "no chat template" not in capsys.readouterr().out
