"""Which vLLM tool-call parser to turn on, checked against the model's own tokenizer.

Some of vLLM's parsers look up a marker token in the tokenizer when a chat request arrives and
refuse the request when it is missing: with ``--enable-auto-tool-choice`` every chat request then
fails with HTTP 500 ("Llama3JsonToolParser could not locate the bot token ..."), tools or not.
That happens with a fine-tune or a test model whose tokenizer dropped the family's markers, so
the parser is chosen by family and then checked against the tokens the tokenizer really has.

:func:`choose_tool_parser` is pure; :func:`tokenizer_tokens` is the thin reader of the files.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from launcher.model import families
from topocommon import jsontext

# vLLM's --tool-call-parser per model family: the family registry's column
FAMILY_PARSERS = {f.name: f.tool_parser for f in families.FAMILIES if f.tool_parser}

# The tokens a parser needs in the vocabulary before it will parse anything (the parsers that
# raise when the lookup fails: llama_tool_parser, deepseekv3_tool_parser, parser/mistral.py).
PARSER_TOKENS: dict[str, tuple[str, ...]] = {
    "llama3_json": ("<|python_tag|>",),
    "mistral": ("[TOOL_CALLS]",),
    "deepseek_v3": (
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
    ),
}


# What a chat template writes around a tool call names the format better than the model type
# does: Qwen3-Coder is a qwen3_moe that writes XML, not Qwen3's JSON; Hermes 3 is a Llama that
# writes Hermes' <tool_call>. Most specific first: Qwen3-Coder and GLM also write <tool_call>.
TEMPLATE_MARKERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<function=", "<parameter="), "qwen3_coder"),
    (("<arg_key>",), "glm45"),
    (("<minimax:tool_call>",), "minimax_m2"),
    (("<|tool_calls_section_begin|>",), "kimi_k2"),
    (("<seed:tool_call>",), "seed_oss"),
    (("<|python_start|>",), "llama4_pythonic"),
    (("<|channel|>", "<|start|>"), "openai"),
    (("<|tool_call|>",), "granite"),
    (("<tool_call>",), "hermes"),
    (("[TOOL_CALLS]",), "mistral"),
    (("<|python_tag|>",), "llama3_json"),
)


def template_parser(template: str | None) -> str | None:
    """The parser for the tool-call format a chat template writes, or None when it names none
    this knows (then the family decides)."""
    if not template:
        return None
    for markers, parser in TEMPLATE_MARKERS:
        if all(m in template for m in markers):
            return parser
    return None


def choose_tool_parser(
    family: str, tokens: frozenset[str] | None, template: str | None = None
) -> tuple[str | None, str | None]:
    """(parser or None, a note for the user or None).

    The chat ``template``'s tool-call markers decide where it has any, else the family.
    ``tokens`` is what the tokenizer holds, or None when its files could not be read: then the
    parser is trusted (the family's published tokenizers carry its markers).
    """
    parser = template_parser(template) or FAMILY_PARSERS.get(family)
    if parser is None:
        return None, f"no vLLM tool-call parser known for the {family} family: tool calls off"
    if tokens is None:
        return parser, None
    missing = [t for t in PARSER_TOKENS.get(parser, ()) if t not in tokens]
    if missing:
        return None, (
            f"tool calls off: vLLM's {parser} parser needs {', '.join(missing)} in the tokenizer, "
            "which this model's tokenizer does not have (with the parser on, vLLM would refuse "
            "every chat request); pass `-- --enable-auto-tool-choice --tool-call-parser NAME` "
            "to choose one yourself"
        )
    return parser, None


def tokenizer_tokens(model_dir: str | Path | None) -> frozenset[str] | None:
    """Every token string the model's tokenizer files name, or None when none could be read."""
    if model_dir is None:
        return None
    root = Path(model_dir)
    if not root.is_dir():
        return None
    found: set[str] = set()
    read_any = False
    for name, extract in (("tokenizer.json", _from_tokenizer_json),
                          ("tokenizer_config.json", _from_tokenizer_config)):
        data = _read_json(root / name)
        if data is None:
            continue
        read_any = True
        found.update(extract(data))
    return frozenset(found) if read_any else None


def chat_template(model_dir: str | Path | None) -> str | None:
    """The model's chat template (chat_template.jinja, else tokenizer_config.json's, the
    default one where it lists several), or None when there is none to read."""
    if model_dir is None:
        return None
    root = Path(model_dir)
    try:
        return (root / "chat_template.jinja").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    data = _read_json(root / "tokenizer_config.json")
    raw = data.get("chat_template") if isinstance(data, dict) else None
    if isinstance(raw, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        raw = named.get("tool_use") or named.get("default")
    return raw if isinstance(raw, str) else None


def lacks_chat_template(model_dir: str | Path | None) -> bool:
    """True only when the model's folder holds its whole tokenizer (tokenizer.json, or a
    SentencePiece tokenizer.model) and no chat template in any file vLLM reads one from
    (chat_template.jinja, a processor's chat_template.json, tokenizer_config.json's): a base
    model, whose chat requests vLLM refuses. A hub model's planning fetch holds only some of
    those files, so there it is never sure: False."""
    if model_dir is None:
        return False
    root = Path(model_dir)
    if not ((root / "tokenizer.json").is_file() or (root / "tokenizer.model").is_file()):
        return False
    return chat_template(root) is None and not (root / "chat_template.json").is_file()


def _read_json(path: Path) -> Any:
    try:
        return jsontext.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError and jsontext's refusals are ValueErrors
        return None


def _strings(items: Iterable[Any]) -> list[str]:
    return [x for x in items if isinstance(x, str)]


def _from_tokenizer_json(data: Any) -> list[str]:
    if not isinstance(data, dict):
        return []
    out: list[str] = []
    added = data.get("added_tokens")
    if isinstance(added, list):
        out += _strings(t.get("content") for t in added if isinstance(t, dict))
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):  # BPE / WordPiece: token -> id
        out += _strings(vocab)
    elif isinstance(vocab, list):  # Unigram: [token, score] pairs
        out += _strings(v[0] for v in vocab if isinstance(v, list) and v)
    return out


def _from_tokenizer_config(data: Any) -> list[str]:
    if not isinstance(data, dict):
        return []
    decoder = data.get("added_tokens_decoder")
    if not isinstance(decoder, dict):
        return []
    return _strings(t.get("content") for t in decoder.values() if isinstance(t, dict))
