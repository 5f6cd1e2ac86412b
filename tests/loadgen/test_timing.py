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
    # 4 events for 8 tokens (a server that batches its stream): 7 tokens after the first.
    pieces = [_token(1.0 + k * 0.1) for k in range(4)] + [_usage(1.3, 16, 8)]
    raw = RawRequest(0, sent=0.5, done=1.3, status=200, pieces=tuple(pieces))
    assert measure(raw, Expected(16, 8)).decode_tok_s == pytest.approx(7 / 0.3)


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
