"""server.front.HeadLimit, the bound on request heads, against a plain reference on generated
heads split at generated points: the verdict never depends on how the bytes arrive."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from server.front import HeadLimit

LINE = st.binary(min_size=1, max_size=300).map(
    lambda b: b.replace(b"\r", b"x").replace(b"\n", b"y"))  # a header line: no CR or LF in it


def reference(lines: list[bytes], leading: int, line_max: int, head_max: int) -> bool:
    """Over a limit: a line (with its CR) longer than line_max, or the head (blank lines before
    it and the final CRLF included) longer than head_max."""
    head = b"\r\n" * leading + b"".join(line + b"\r\n" for line in lines) + b"\r\n"
    return max(len(line) + 1 for line in lines) > line_max or len(head) > head_max


def feed_split(limit: HeadLimit, data: bytes, cuts: list[int]) -> str | None:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for start, end in itertools.pairwise(points):
        over = limit.feed(data[start:end])
        if over is not None or limit.done:
            return over
    return None


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(LINE, min_size=1, max_size=12), leading=st.integers(0, 2),
       line_max=st.integers(8, 400), head_max=st.integers(8, 2000),
       cuts=st.lists(st.integers(0, 10_000), max_size=8),
       body=st.binary(max_size=600))
def test_the_verdict_is_the_reference_however_the_head_is_split(
        lines: list[bytes], leading: int, line_max: int, head_max: int, cuts: list[int],
        body: bytes) -> None:
    lines[0] = b"G" + lines[0]  # a request line is never blank
    head = b"\r\n" * leading + b"".join(line + b"\r\n" for line in lines) + b"\r\n"
    limit = HeadLimit(line_max, head_max)
    over = feed_split(limit, head + body, cuts)
    assert (over is not None) == reference(lines, leading, line_max, head_max)
    if over is None:
        assert limit.done  # the body after the head is never counted


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 5000), chunk=st.integers(1, 700), line_max=st.integers(8, 400))
def test_an_unterminated_line_is_over_once_past_the_limit(size: int, chunk: int,
                                                          line_max: int) -> None:
    data = b"GET / HTTP/1.1\r\nx-endless: " + b"a" * size
    limit = HeadLimit(line_max, 10 * line_max)
    over = None
    for start in range(0, len(data), chunk):
        over = over or limit.feed(data[start:start + chunk])
    # the request line is 15 bytes with its CR, the endless one 11 + size so far
    assert (over is not None) == (max(15, 11 + size) > line_max)
    assert not limit.done


def test_reset_starts_a_new_head() -> None:
    limit = HeadLimit(100, 1000)
    assert limit.feed(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n") is None
    assert limit.done
    limit.reset()
    assert not limit.done
    assert limit.feed(b"x" * 101) is not None
