"""Per-request measures from synthetic raw timestamps: exact arithmetic, no clock."""

from __future__ import annotations

import json

import pytest

from loadgen.timing import Expected, RawRequest, measure


def _token(t: float) -> tuple[float, bytes]:
    return (t, b'data: {"choices":[{"index":0,"text":"x"}]}\n\n')


def _usage(t: float, prompt: int, completion: int) -> tuple[float, bytes]:
    body = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    return (t, b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n")


def _stream(sent: float, ttft: float, itl: float, n: int, prompt: int) -> RawRequest:
    pieces = [_token(sent + ttft + k * itl) for k in range(n)]
    last = sent + ttft + (n - 1) * itl
    pieces.append(_usage(last, prompt, n))
    return RawRequest(index=0, sent=sent, done=last, status=200, pieces=tuple(pieces))


def test_measures_follow_the_architecture_definitions() -> None:
    raw = _stream(sent=10.0, ttft=0.08, itl=0.012, n=256, prompt=512)
    r = measure(raw, Expected(512, 256))
    assert r.error is None
    assert r.ttft_s == pytest.approx(0.08)
    assert r.prefill_tok_s == pytest.approx(512 / 0.08)
    assert r.decode_tok_s == pytest.approx(1 / 0.012)
    assert r.e2e_s == pytest.approx(0.08 + 255 * 0.012)
    assert len(r.itl_s) == 255
    assert all(gap == pytest.approx(0.012) for gap in r.itl_s)


def test_decode_rate_uses_usage_count_even_when_events_carry_several_tokens() -> None:
    # 4 events for 8 tokens (a server that batches its stream): 2 tokens per event, so 6
    # tokens arrived after the first event, over 0.3 s (the 2 of the first event took no time).
    pieces = [_token(1.0 + k * 0.1) for k in range(4)] + [_usage(1.3, 16, 8)]
    raw = RawRequest(0, sent=0.5, done=1.3, status=200, pieces=tuple(pieces))
    r = measure(raw, Expected(16, 8))
    assert r.decode_tok_s == pytest.approx(6 / 0.3)
    assert r.completion_tokens == 8  # from usage, not the 4 events


def _text_token(t: float, text: str) -> tuple[float, bytes]:
    body = {"choices": [{"index": 0, "text": text}]}
    return (t, b"data: " + json.dumps(body).encode() + b"\n\n")


def test_two_token_chunks_give_per_token_itl_of_half_the_gap_never_zero() -> None:
    # 128 events of 2 tokens each, 20 ms apart: the true ITL is 10 ms per token.
    pieces = [_text_token(1.0 + k * 0.02, " ab cd") for k in range(128)]
    pieces.append(_usage(1.0 + 127 * 0.02, 8, 256))
    raw = RawRequest(0, sent=0.9, done=4.0, status=200, pieces=tuple(pieces))
    r = measure(raw, Expected(8, 256))
    assert r.error is None
    assert r.completion_tokens == 256
    assert r.chunks == 128
    assert r.itl_even  # no tokenizer: the two-per-event split is the mean
    assert min(r.itl_s) > 0
    assert all(gap == pytest.approx(0.01) for gap in r.itl_s)
    assert r.decode_tok_s == pytest.approx(254 / (127 * 0.02))


def test_with_a_tokenizer_each_event_is_split_by_its_own_count() -> None:
    # events of 1, 3 and 2 tokens (a word per token): gaps of 30 ms and 20 ms
    pieces = [_text_token(1.0, " a"), _text_token(1.03, " b c d"), _text_token(1.05, " e f")]
    pieces.append(_usage(1.05, 4, 6))
    raw = RawRequest(0, sent=0.9, done=1.1, status=200, pieces=tuple(pieces))
    r = measure(raw, Expected(4, 6), count_output=lambda text: len(text.split()))
    assert not r.itl_even
    assert r.itl_s == pytest.approx((0.01, 0.01, 0.01, 0.01, 0.01))
    assert r.decode_tok_s == pytest.approx(5 / 0.05)


def test_without_usage_the_tokenizer_counts_the_output_text_not_the_events() -> None:
    pieces = [_text_token(1.0 + k * 0.02, " ab cd") for k in range(4)]
    raw = RawRequest(0, sent=0.9, done=1.1, status=200, pieces=tuple(pieces))
    r = measure(raw, Expected(16, 8), count_output=lambda text: len(text.split()))
    assert (r.prompt_tokens, r.completion_tokens, r.counted_by, r.error) == (
        16,
        8,
        "tokenizer",
        None,
    )
    short = measure(raw, Expected(16, 9), count_output=lambda text: len(text.split()))
    assert short.error == "token count mismatch: completion 8 != 9"


def test_a_calibrated_prompt_that_is_off_is_reported_not_failed() -> None:
    raw = _stream(sent=0.0, ttft=0.1, itl=0.01, n=3, prompt=511)
    r = measure(raw, Expected(512, 3, strict_prompt=False))
    assert r.ok
    assert (r.prompt_tokens, r.prompt_expected) == (511, 512)


def test_cached_tokens_and_raw_timestamps_are_kept() -> None:
    body = {
        "choices": [],
        "usage": {
            "prompt_tokens": 4,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 3},
        },
    }
    pieces = (_token(1.1), _token(1.2), (1.2, b"data: " + json.dumps(body).encode() + b"\n\n"))
    r = measure(RawRequest(0, sent=1.0, done=1.25, status=200, pieces=pieces), Expected(4, 2))
    assert r.cached_tokens == 3
    assert (r.sent_at, r.first_at, r.done_at) == (1.0, 1.1, 1.25)
    assert r.tpot_s == pytest.approx(0.15)


@pytest.mark.parametrize(
    ("prompt", "completion", "error"),
    [
        (511, 256, "token count mismatch: prompt 511 != 512"),
        (512, 200, "token count mismatch: completion 200 != 256"),
        (513, 1, "token count mismatch: prompt 513 != 512, completion 1 != 256"),
    ],
)
def test_a_count_mismatch_is_an_error_not_a_sample(
    prompt: int, completion: int, error: str
) -> None:
    raw = _stream(sent=0.0, ttft=0.1, itl=0.01, n=3, prompt=prompt)
    pieces = (*raw.pieces[:-1], _usage(0.2, prompt, completion))
    r = measure(RawRequest(0, 0.0, 0.2, 200, pieces), Expected(512, 256))
    assert r.error == error
    assert not r.ok


def test_missing_usage_is_reported() -> None:
    raw = RawRequest(0, 0.0, 1.0, 200, (_token(0.5),))
    assert "no usage" in (measure(raw, Expected(1, 1)).error or "")


def test_http_error_body_message_is_kept() -> None:
    body = b'{"error":{"message":"model overloaded","type":"ServiceUnavailable"}}'
    raw = RawRequest(0, 0.0, 0.1, 503, ((0.1, body),))
    assert measure(raw, Expected(1, 1)).error == "HTTP 503: model overloaded"


def test_transport_error_wins_over_everything() -> None:
    raw = RawRequest(0, 0.0, 0.1, 0, (), error="cannot connect to x:1: Connection refused")
    r = measure(raw, Expected(1, 1))
    assert r.error == "cannot connect to x:1: Connection refused"
    assert r.ttft_s is None


def test_send_lag_is_sent_minus_scheduled() -> None:
    raw = _stream(sent=5.003, ttft=0.1, itl=0.01, n=2, prompt=4)
    lagged = RawRequest(0, raw.sent, raw.done, 200, raw.pieces, scheduled=5.0)
    assert measure(lagged, Expected(4, 2)).send_lag_s == pytest.approx(0.003)


def test_time_to_headers_is_kept_apart_from_ttft() -> None:
    raw = _stream(sent=1.0, ttft=0.1, itl=0.01, n=2, prompt=4)
    with_headers = RawRequest(0, raw.sent, raw.done, 200, raw.pieces, headers_at=1.03)
    r = measure(with_headers, Expected(4, 2))
    assert r.headers_s == pytest.approx(0.03)
    assert r.ttft_s == pytest.approx(0.1)
