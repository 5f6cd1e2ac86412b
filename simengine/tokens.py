"""Deterministic token counting of the simulated engine (pure).

Text is one token per whitespace-separated word (``"a b  c"`` is 3 tokens, ``""`` is 0); a
prompt given as token ids is as many tokens as ids. Chat messages count the words of every text
content (a string, or the ``text`` of ``{"type": "text"}`` parts), with no template overhead. The
ids of a word are a CRC32 of its UTF-8 bytes modulo the vocabulary, so they are stable across runs.
"""

from __future__ import annotations

import zlib
from typing import Any

VOCAB_SIZE = 32000


class PromptError(ValueError):
    """The request's prompt has a shape the simulated engine does not accept."""


def text_token_ids(text: str) -> list[int]:
    return [zlib.crc32(word.encode("utf-8", "surrogatepass")) % VOCAB_SIZE for word in text.split()]


def prompt_token_ids(prompt: Any) -> list[int]:
    """Token ids of a /v1/completions ``prompt``: a string, a list of ids, or one-element lists."""
    if isinstance(prompt, str):
        return text_token_ids(prompt)
    if isinstance(prompt, list) and all(_is_token_id(t) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return prompt_token_ids(prompt[0])
    raise PromptError("prompt must be a string, a list of token ids, or a list of one of those")


def messages_token_ids(messages: Any) -> list[int]:
    """Token ids of a chat ``messages`` list: the words of every text content, in order."""
    if not isinstance(messages, list):
        raise PromptError("messages must be a list of {role, content} objects")
    ids: list[int] = []
    for message in messages:
        if not isinstance(message, dict):
            raise PromptError("each message must be an object with role and content")
        ids.extend(text_token_ids(_content_text(message.get("content"))))
    return ids


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return " ".join(p for p in parts if isinstance(p, str))
    raise PromptError("message content must be a string or a list of content parts")


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
