"""topocommon.sse.SseReader, the one SSE reader of the benchmark client and loadgen: any split
of any stream reads the same as the whole, whatever its line ends."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from topocommon.sse import Event, SseReader


def read(pieces: list[bytes]) -> list[Event]:
    reader = SseReader()
    events = [e for p in pieces for e in reader.feed(p)]
    return events + reader.finish()


def test_fields_names_and_multiline_data() -> None:
    stream = (b": comment\nevent: message_stop\ndata: {\"a\": 1}\n\ndata:x\ndata: y\nid: 3\n\n"
              b"event: ping\n\n")
    assert read([stream]) == [Event(b"message_stop", b'{"a": 1}'), Event(b"message", b"x\ny")]


@given(events=st.lists(st.tuples(st.sampled_from([b"", b"content_block_delta", b"error"]),
                                 st.binary(max_size=20).map(
                                     lambda b: b.replace(b"\r", b"").replace(b"\n", b""))),
                       max_size=5),
       line_end=st.sampled_from([b"\n", b"\r", b"\r\n"]),
       cuts=st.lists(st.integers(0, 200), max_size=8))
def test_any_split_and_any_line_end_read_as_the_whole(
        events: list[tuple[bytes, bytes]], line_end: bytes, cuts: list[int]) -> None:
    stream = b"".join((b"event: " + n + line_end if n else b"") + b"data: " + d + line_end * 2
                      for n, d in events)
    points = sorted({c for c in cuts if c <= len(stream)})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    assert read(pieces) == [Event(n or b"message", d) for n, d in events]


def test_a_last_event_without_its_blank_line_still_counts() -> None:
    assert read([b"data: [DONE]"]) == [Event(b"message", b"[DONE]")]
