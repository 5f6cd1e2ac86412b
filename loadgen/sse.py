"""Server-sent events of an OpenAI-style stream, parsed after the fact (pure).

The request loop only stores the body pieces as they arrived, each with its arrival time. These
functions turn those pieces into timed events and classify each one; nothing here reads a clock.

An event is dispatched at the blank line that ends it (the SSE rule), so it carries the arrival
time of the piece holding that blank line: the moment the client could first have used it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from topocommon import jsontext
from topocommon.sse import SseReader

DONE = b"[DONE]"


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    # usage.prompt_tokens_details.cached_tokens: prompt tokens the server's prefix cache served
    # (vLLM with --enable-prompt-tokens-details, OpenAI, SGLang); None when not given.
    cached_tokens: int | None = None


@dataclass(frozen=True)
class Chunk:
    """What one event's data means to loadgen."""

    tokens: bool = False  # carries generated output (one or more tokens)
    text: str = ""  # the output text it carries (counted only when usage lacks or chunks merge)
    usage: Usage | None = None
    error: str | None = None
    done: bool = False  # the `[DONE]` sentinel


def timed_events(pieces: Iterable[tuple[float, bytes]]) -> list[tuple[float, bytes]]:
    """Join body pieces into (arrival time, data) events; a trailing unterminated event counts.

    Read with the SSE reader the benchmark client shares (topocommon.sse: CR, LF and CRLF line
    ends, split anywhere); an event's time is that of the piece that completed it."""
    reader = SseReader()
    events: list[tuple[float, bytes]] = []
    last_t = 0.0
    for t, piece in pieces:
        events += [(t, event.data) for event in reader.feed(piece)]
        last_t = t
    return events + [(last_t, event.data) for event in reader.finish()]


def classify(payload: bytes) -> Chunk:
    """Meaning of one event's data: tokens, usage, an error, `[DONE]`, or nothing we use."""
    if payload.strip() == DONE:
        return Chunk(done=True)
    try:
        body = jsontext.loads(payload)
    except ValueError:
        return Chunk(error=f"malformed stream event: {payload[:80]!r}")
    if not isinstance(body, dict):
        return Chunk(error=f"malformed stream event: {payload[:80]!r}")
    if "error" in body:
        return Chunk(error=error_message(body))
    choices = body.get("choices")
    tokens = _has_tokens(choices)
    return Chunk(
        tokens=tokens, text=_text(choices) if tokens else "", usage=_usage(body.get("usage"))
    )


def error_message(body: object) -> str:
    """The human part of an OpenAI/vLLM/FastAPI error body."""
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body.get("message")))
        if isinstance(error, dict):
            error = error.get("message", error)
        if error is not None:
            return str(error)[:300]
    return str(body)[:300]


def _has_tokens(choices: object) -> bool:
    # A chat stream opens with a role-only delta sent before any token; it is not output.
    if not isinstance(choices, list) or not choices:
        return False
    choice = choices[0]
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    if isinstance(delta, dict) and "role" in delta:
        return bool(delta.get("content") or delta.get("reasoning_content"))
    return True


def _text(choices: object) -> str:
    """Output text of a token event: completions' `text`, chat's delta content (and reasoning)."""
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        return ""
    text = choice.get("text")
    if isinstance(text, str):
        return text
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return ""
    parts = (delta.get("reasoning_content"), delta.get("content"))
    return "".join(p for p in parts if isinstance(p, str))


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _usage(usage: object) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return Usage(prompt, completion, cached)
