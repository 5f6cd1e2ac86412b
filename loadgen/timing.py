"""Per-request measures as pure functions of the raw timestamps the request loop recorded.

Definitions (architecture.md): TTFT = first generated token − request sent; prefill tok/s =
prompt tokens / TTFT; decode tok/s = (completion tokens − 1) / (last token − first token);
ITL = gaps between token arrivals; e2e = last byte − request sent. Token counts come from the
server's `usage`; a request that did not get exactly what it asked for is an error, not a sample.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

from loadgen.sse import Chunk, Usage, classify, error_message, timed_events


@dataclass(frozen=True)
class RawRequest:
    """What the request loop records: clock readings and bytes, nothing derived."""

    index: int
    sent: float  # perf_counter just before the request bytes were written
    done: float  # perf_counter when the response ended (or failed)
    status: int = 0  # HTTP status; 0 when none arrived
    pieces: tuple[tuple[float, bytes], ...] = ()  # body pieces with their arrival times
    error: str | None = None  # transport failure (connect, reset, timeout)
    scheduled: float | None = None  # when an open-loop schedule wanted it sent
    headers_at: float | None = None  # when the response headers arrived


@dataclass(frozen=True)
class Expected:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class RequestResult:
    index: int
    prompt_tokens: int | None
    completion_tokens: int | None
    ttft_s: float | None
    e2e_s: float
    prefill_tok_s: float | None
    decode_tok_s: float | None
    itl_s: tuple[float, ...]
    send_lag_s: float | None  # sent − scheduled (open loop only)
    error: str | None
    # Response headers − sent: the server took the request (before any token). Not part of the
    # architecture's definitions; it tells queueing in front of the engine apart from prefill.
    headers_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def measure(raw: RawRequest, expected: Expected) -> RequestResult:
    """Derive every per-request measure from `raw`; counts are checked against `expected`."""
    events = [(t, classify(data)) for t, data in timed_events(raw.pieces)]
    token_times = [t for t, chunk in events if chunk.tokens]
    usages = [chunk.usage for _, chunk in events if chunk.usage is not None]
    usage = usages[-1] if usages else None
    first = token_times[0] if token_times else None
    ttft = first - raw.sent if first is not None else None
    prompt = usage.prompt_tokens if usage else None
    completion = usage.completion_tokens if usage else None
    return RequestResult(
        index=raw.index,
        prompt_tokens=prompt,
        completion_tokens=completion,
        ttft_s=ttft,
        e2e_s=raw.done - raw.sent,
        prefill_tok_s=prompt / ttft if prompt is not None and ttft else None,
        decode_tok_s=_decode_rate(completion, token_times),
        itl_s=tuple(b - a for a, b in itertools.pairwise(token_times)),
        send_lag_s=raw.sent - raw.scheduled if raw.scheduled is not None else None,
        error=_error(raw, events, usage, expected, bool(token_times)),
        headers_s=raw.headers_at - raw.sent if raw.headers_at is not None else None,
    )


def _decode_rate(completion: int | None, token_times: list[float]) -> float | None:
    if completion is None or completion < 2 or len(token_times) < 2:
        return None
    span = token_times[-1] - token_times[0]
    return (completion - 1) / span if span > 0 else None


def _error(
    raw: RawRequest,
    events: list[tuple[float, Chunk]],
    usage: Usage | None,
    expected: Expected,
    tokens: bool,
) -> str | None:
    if raw.error is not None:
        return raw.error
    if raw.status != 200:
        return f"HTTP {raw.status}: {_body_error(raw.pieces)}"
    stream_errors = [chunk.error for _, chunk in events if chunk.error]
    if stream_errors:
        return f"stream error: {stream_errors[0]}"
    if not tokens:
        return "no tokens streamed"
    if usage is None:
        return "no usage in the stream: the server must honour stream_options.include_usage"
    return _count_mismatch(usage, expected)


def _count_mismatch(usage: Usage, expected: Expected) -> str | None:
    wrong = []
    if usage.prompt_tokens != expected.prompt_tokens:
        wrong.append(f"prompt {usage.prompt_tokens} != {expected.prompt_tokens}")
    if usage.completion_tokens != expected.completion_tokens:
        wrong.append(f"completion {usage.completion_tokens} != {expected.completion_tokens}")
    return "token count mismatch: " + ", ".join(wrong) if wrong else None


def _body_error(pieces: tuple[tuple[float, bytes], ...]) -> str:
    body = b"".join(piece for _, piece in pieces)
    try:
        return error_message(json.loads(body))
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip() or "(empty body)"
