"""server.front.Exchange holds a streamed response's head for its first chunk (one write fewer
per request), at most HEAD_HOLD_S: exactly what goes out in which write, on a recording
transport and a loop whose timers the test fires itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from server import front

SSE = [(b"content-type", b"text/event-stream")]


class Timer:
    def __init__(self, delay: float, callback: Callable[[], None]) -> None:
        self.delay, self.callback, self.cancelled = delay, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    def __init__(self) -> None:
        self.timers: list[Timer] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        self.timers.append(Timer(delay, callback))
        return self.timers[-1]

    def create_future(self) -> asyncio.Future[None]:
        raise AssertionError("not used here")


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


class Host:
    def __init__(self) -> None:
        self.default_headers = [(b"date", b"today")]


class Proto:
    def __init__(self) -> None:
        self.transport = Transport()
        self.loop = Loop()
        self.host = Host()
        self.write_paused = False
        self.done: list[Any] = []

    def response_done(self, ex: front.Exchange) -> None:
        self.done.append(ex)

    def resume_reading(self) -> None:
        pass


@pytest.fixture
def proto() -> Proto:
    return Proto()


def exchange(proto: Proto) -> front.Exchange:
    ex = front.Exchange(proto, True)  # type: ignore[arg-type]
    ex._start(200, SSE)
    return ex


def send(ex: front.Exchange, body: bytes, more: bool) -> None:
    asyncio.run(ex.send({"type": "http.response.body", "body": body, "more_body": more}))


def test_a_streams_head_goes_out_with_its_first_chunk_in_one_write(proto: Proto) -> None:
    ex = exchange(proto)
    assert proto.transport.writes == []
    ex.write(b"data: a\n\n")
    ex.write(b"data: b\n\n")
    first, second = proto.transport.writes
    assert first.startswith(b"HTTP/1.1 200 OK\r\ndate: today\r\ncontent-type: text/event-stream")
    assert first.endswith(b"transfer-encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n")
    assert second == b"9\r\ndata: b\n\n\r\n"
    (timer,) = proto.loop.timers
    assert timer.delay == front.HEAD_HOLD_S
    assert timer.cancelled


def test_a_head_with_no_chunk_within_the_hold_goes_out_alone(proto: Proto) -> None:
    ex = exchange(proto)
    proto.loop.timers[0].callback()  # HEAD_HOLD_S passed: the prefill is long
    (head,) = proto.transport.writes
    assert head.endswith(b"transfer-encoding: chunked\r\n\r\n")
    ex.write(b"data: a\n\n")
    assert proto.transport.writes[1] == b"9\r\ndata: a\n\n\r\n"


def test_a_stream_ending_without_a_chunk_sends_head_and_end_together(proto: Proto) -> None:
    ex = exchange(proto)
    send(ex, b"", more=True)  # nothing to write yet: the head still waits
    assert proto.transport.writes == []
    send(ex, b"", more=False)
    (only,) = proto.transport.writes
    assert only.endswith(b"transfer-encoding: chunked\r\n\r\n0\r\n\r\n")
    assert proto.done == [ex]
    assert proto.loop.timers[0].cancelled


def test_a_client_gone_before_the_hold_ends_gets_no_write(proto: Proto) -> None:
    ex = exchange(proto)
    ex.disconnected = True
    proto.loop.timers[0].callback()
    assert proto.transport.writes == []


def test_an_aborted_stream_cancels_the_hold(proto: Proto) -> None:
    ex = exchange(proto)
    ex.abort()
    assert proto.transport.aborted
    assert proto.loop.timers[0].cancelled
    assert proto.transport.writes == []


def test_a_response_with_a_length_is_written_at_once(proto: Proto) -> None:
    ex = front.Exchange(proto, True)  # type: ignore[arg-type]
    ex._start(200, [(b"content-type", b"application/json"), (b"content-length", b"2")])
    (head,) = proto.transport.writes
    assert head.endswith(b"content-length: 2\r\n\r\n")
    assert proto.loop.timers == []
