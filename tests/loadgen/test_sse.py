"""SSE parsing and classification: pure functions, table-driven."""

from __future__ import annotations

import pytest

from loadgen.sse import Chunk, Usage, classify, timed_events


@pytest.mark.parametrize(
    ("line", "payload"),
    [
        (b"data: {}", b"{}"),
        (b"data:{}", b"{}"),
        (b"data:  x", b" x"),
        (b": keep-alive comment", None),
        (b"event: message", None),
        (b"", None),
    ],
)
def test_only_data_lines_make_an_event(line: bytes, payload: bytes | None) -> None:
    assert timed_events([(1.0, line + b"\n\n")]) == ([] if payload is None else [(1.0, payload)])


def test_bare_cr_line_ends_keep_their_events() -> None:
    # SSE allows CR alone; the old line splitter lost these tokens (issue 25)
    pieces = [(1.0, b"data: a\r\rdata: b\r"), (2.0, b"\r")]
    assert timed_events(pieces) == [(1.0, b"a"), (2.0, b"b")]


def test_events_are_stamped_with_the_piece_that_completed_them() -> None:
    pieces = [(1.0, b"data: a\n"), (2.0, b"\ndata: b\n\nda"), (3.0, b"ta: c\r\n\r\n")]
    assert timed_events(pieces) == [(2.0, b"a"), (2.0, b"b"), (3.0, b"c")]


def test_an_unterminated_last_event_still_counts() -> None:
    assert timed_events([(1.0, b"data: [DONE]")]) == [(1.0, b"[DONE]")]


def test_multi_line_data_is_joined_with_newlines() -> None:
    assert timed_events([(5.0, b"data: x\ndata: y\n\n")]) == [(5.0, b"x\ny")]


@pytest.mark.parametrize(
    ("payload", "chunk"),
    [
        (b"[DONE]", Chunk(done=True)),
        (b'{"choices":[{"index":0,"text":"hi"}]}', Chunk(tokens=True, text="hi")),
        # an empty text is still a token: partial UTF-8 sequences stream as ""
        (b'{"choices":[{"index":0,"text":""}]}', Chunk(tokens=True)),
        (
            b'{"choices":[],"usage":{"prompt_tokens":512,"completion_tokens":256}}',
            Chunk(usage=Usage(512, 256)),
        ),
        (
            b'{"choices":[],"usage":{"prompt_tokens":512,"completion_tokens":256,'
            b'"prompt_tokens_details":{"cached_tokens":480}}}',
            Chunk(usage=Usage(512, 256, cached_tokens=480)),
        ),
        (b'{"choices":[],"usage":{"prompt_tokens":true,"completion_tokens":2}}', Chunk()),
        (b'{"choices":[{"delta":{"role":"assistant","content":""}}]}', Chunk()),
        (
            b'{"choices":[{"delta":{"role":"assistant","content":"x"}}]}',
            Chunk(tokens=True, text="x"),
        ),
        (b'{"choices":[{"delta":{"content":"x"}}]}', Chunk(tokens=True, text="x")),
        (
            b'{"choices":[{"delta":{"reasoning_content":"r","content":"x"}}]}',
            Chunk(tokens=True, text="rx"),
        ),
        (b'{"error":{"message":"boom","code":500}}', Chunk(error="boom")),
        (b"not json", Chunk(error="malformed stream event: b'not json'")),
    ],
)
def test_classify_tells_tokens_usage_errors_and_done_apart(payload: bytes, chunk: Chunk) -> None:
    assert classify(payload) == chunk
