"""Per-request measures as pure functions of the raw timestamps the request loop recorded.

Definitions (architecture.md): TTFT = first generated token − request sent; prefill tok/s =
prompt tokens / TTFT; decode tok/s = (completion tokens − 1) / (last token − first token);
ITL = gaps between token arrivals, per token; e2e = last byte − request sent. Token counts come
from the server's `usage` (else from a local tokenizer, never from the number of events); a
request that did not get exactly what it asked for is an error, not a sample.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from loadgen.sse import Chunk, Usage, classify, error_message, timed_events
from topocommon import jsontext


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
    # False when the prompt length is an estimate (calibrated from usage, no tokenizer at hand):
    # a different count is then reported per request (prompt_expected beside prompt_tokens), not
    # a failure, since nothing loadgen could do would have made it exact.
    strict_prompt: bool = True
    # False when the server refused the exact-length fields: an answer shorter than asked (the
    # model stopped) is its own result, not a failure; a longer one still is.
    strict_completion: bool = True


OutputCounter = Callable[[str], int]  # tokens of generated text (a local tokenizer)


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
    prompt_expected: int | None = None  # what was asked (differs from prompt_tokens only if lax)
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    counted_by: str = "usage"  # "usage", or "tokenizer" when the server sent no usage
    # Token events that carried output, and whether the ITL samples were spread evenly because
    # some events carried several tokens whose split is unknown (see _tokens_per_event).
    chunks: int = 0
    itl_even: bool = False
    # Raw perf_counter readings (one monotonic clock), for requests-in-flight over time.
    sent_at: float = 0.0
    first_at: float | None = None
    done_at: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (e2e − TTFT) / (completion − 1)."""
        n = self.completion_tokens
        if self.ttft_s is None or n is None or n < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)


def measure(
    raw: RawRequest, expected: Expected, count_output: OutputCounter | None = None
) -> RequestResult:
    """Derive every per-request measure from `raw`; counts are checked against `expected`.

    Token counts come from the stream's usage. Without usage, and with a tokenizer at hand
    (`count_output`), the output is counted from the streamed text and the prompt is taken as
    built (its length was counted with the same tokenizer); never from the number of events.
    """
    events = [(t, classify(data)) for t, data in timed_events(raw.pieces)]
    token_events = [(t, chunk) for t, chunk in events if chunk.tokens]
    token_times = [t for t, _ in token_events]
    usages = [chunk.usage for _, chunk in events if chunk.usage is not None]
    usage = usages[-1] if usages else None
    counted_by = "usage"
    if usage is None and count_output is not None and token_events:
        text = "".join(chunk.text for _, chunk in token_events)
        usage = Usage(expected.prompt_tokens, count_output(text))
        counted_by = "tokenizer"
    first = token_times[0] if token_times else None
    ttft = first - raw.sent if first is not None else None
    prompt = usage.prompt_tokens if usage else None
    completion = usage.completion_tokens if usage else None
    per_event = _tokens_per_event(completion, token_events, count_output)
    return RequestResult(
        index=raw.index,
        prompt_tokens=prompt,
        completion_tokens=completion,
        ttft_s=ttft,
        e2e_s=raw.done - raw.sent,
        prefill_tok_s=prompt / ttft if prompt is not None and ttft else None,
        decode_tok_s=_decode_rate(completion, token_times, per_event),
        itl_s=_itl(token_times, completion, per_event),
        send_lag_s=raw.sent - raw.scheduled if raw.scheduled is not None else None,
        error=_error(raw, events, usage, expected, bool(token_times)),
        headers_s=raw.headers_at - raw.sent if raw.headers_at is not None else None,
        prompt_expected=expected.prompt_tokens,
        cached_tokens=usage.cached_tokens if usage else None,
        counted_by=counted_by,
        chunks=len(token_times),
        itl_even=per_event is None and len(token_times) > 1,
        sent_at=raw.sent,
        first_at=first,
        done_at=raw.done,
    )


def _tokens_per_event(
    completion: int | None,
    token_events: list[tuple[float, Chunk]],
    count_output: OutputCounter | None,
) -> list[int] | None:
    """How many tokens each token event carried, or None when that is not known.

    One each when there are as many events as tokens (vLLM, the simulator). Otherwise, with a
    tokenizer, each event's text counted on its own, if those counts add up to the total
    (tokens split across events can count differently alone); else unknown.
    """
    if completion is None or not token_events:
        return None
    if completion == len(token_events):
        return [1] * completion
    if count_output is not None:
        counts = [count_output(chunk.text) for _, chunk in token_events]
        if sum(counts) == completion and all(c > 0 for c in counts):
            return counts
    return None


def _decode_rate(
    completion: int | None, token_times: list[float], per_event: list[int] | None
) -> float | None:
    """Tokens after the first event / time from the first event to the last one.

    With one token per event this is (completion − 1) / (last − first). Tokens that arrive
    together with the first one took no time on the client's clock, so they are not counted
    (several-token events: the first event's count, or the mean per event when unknown).
    """
    if completion is None or completion < 2 or len(token_times) < 2:
        return None
    span = token_times[-1] - token_times[0]
    first = per_event[0] if per_event is not None else completion / len(token_times)
    return (completion - first) / span if span > 0 else None


def _itl(
    token_times: list[float], completion: int | None, per_event: list[int] | None
) -> tuple[float, ...]:
    """Per-token gaps. An event of k tokens after a gap g gives k samples of g/k (the tokens
    shared the wait); when k is unknown, each gap is divided by the mean tokens per event
    (all of them). Never a 0 for tokens that merely arrived together."""
    gaps = [b - a for a, b in itertools.pairwise(token_times)]
    if per_event is not None:
        if len(per_event) == completion:  # one token per event: the gaps as they are
            return tuple(gaps)
        return tuple(g / k for g, k in zip(gaps, per_event[1:], strict=True) for _ in range(k))
    if not completion or not gaps:
        return tuple(gaps)
    mean = completion / len(token_times)
    return tuple(g / mean for g in gaps)


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
    if expected.strict_prompt and usage.prompt_tokens != expected.prompt_tokens:
        wrong.append(f"prompt {usage.prompt_tokens} != {expected.prompt_tokens}")
    short_ok = (not expected.strict_completion
                and usage.completion_tokens < expected.completion_tokens)
    if usage.completion_tokens != expected.completion_tokens and not short_ok:
        wrong.append(f"completion {usage.completion_tokens} != {expected.completion_tokens}")
    return "token count mismatch: " + ", ".join(wrong) if wrong else None


def _body_error(pieces: tuple[tuple[float, bytes], ...]) -> str:
    body = b"".join(piece for _, piece in pieces)
    try:
        return error_message(jsontext.loads(body))
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip() or "(empty body)"
