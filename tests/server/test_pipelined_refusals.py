"""A pipelined request the proxy refuses (its head too large, not HTTP, an upgrade) while an
earlier request on the connection is still being answered, over raw loopback sockets against a
real proxy. Failed on the code before its fix: uvicorn's protocol (every route but the lean
generation path) wrote the refusal as soon as it read the pipelined bytes, in the middle of
the streamed answer before it (a 431 between two of its chunks, the rest of the stream lost,
its next write failing: a 500 in the proxy's log). Now the refusal waits until every earlier
answer is complete, as nginx reads the next request only once one is answered.
"""

from __future__ import annotations

import json
import re
import socket
import threading

import pytest

from tests.server.conftest import SpawnProxy
from tests.server.hostile import (
    connect,
    request_bytes,
    scripted_engine,
    wait_for,
)

FIRST = b'event: message_start\ndata: {"type": "message_start", "message": {"id": "m"}}\n\n'
LAST = b'event: message_stop\ndata: {"type": "message_stop"}\n\n'
BODY = json.dumps({"model": "scripted", "max_tokens": 5, "stream": True,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()

REFUSED = {
    "head too large": (b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: "
                       + b"a" * 70_000 + b"\r\n\r\n", 431),
    "not HTTP": (b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\nno colon here\r\n\r\n", 400),
    "an upgrade": (b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\nupgrade: websocket\r\n"
                   b"connection: upgrade\r\n\r\n", 400),
    # its head is whole and it is queued: the refusal of its chunked framing is its answer
    "trailers too large": (b"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                           b"content-type: application/json\r\ntransfer-encoding: chunked\r\n"
                           b"\r\n0\r\n" + b"x-t: %b\r\n" % (b"a" * 1000) * 12, 431),
}


SMALL_LIMITS = ("--max-header-line-bytes", "2048", "--max-header-bytes", "8192")


@pytest.mark.parametrize("what", list(REFUSED))
def test_a_refused_pipelined_request_is_answered_after_the_stream_before_it_not_inside_it(
        spawn_proxy: SpawnProxy, what: str) -> None:
    go = threading.Event()

    def script(conn: socket.socket, method: str, path: str, body: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n%x\r\n%b\r\n" % (len(FIRST), FIRST))
        go.wait(10)
        conn.sendall(b"%x\r\n%b\r\n0\r\n\r\n" % (len(LAST), LAST))

    pipelined, status = REFUSED[what]
    with scripted_engine(script) as engine:
        # small limits (10 KiB of framing), so that the trailers come in one read
        p = spawn_proxy([engine], *SMALL_LIMITS)
        with connect(p.url) as sock:
            sock.sendall(request_bytes("POST", "/v1/messages",
                                       {"content-type": "application/json"}, BODY, close=False))
            seen = b""
            while FIRST not in seen:  # the answer has begun
                seen += sock.recv(65536)
            sock.sendall(pipelined)
            # the proxy has read the pipelined request (and, before the fix, answered it);
            # trailers that came in a read apart from their head are read only after the
            # answer (uvicorn pauses reading at a queued head): then there is nothing to see
            read = wait_for(lambda: "refuse" in p.log())
            assert read or what == "trailers too large"
            go.set()
            rest = read_to_end(sock)
        stream, sep, refusal = (seen + rest).partition(b"0\r\n\r\n")
        assert sep, "the stream was not ended"
        assert stream.startswith(b"HTTP/1.1 200 OK")
        assert FIRST in stream
        assert LAST in stream
        assert refusal.startswith(b"HTTP/1.1 %d " % status)
        assert b"connection: close" in refusal
        assert "internal error" not in p.log()


def test_requests_queued_before_a_refused_one_are_all_answered_first(
        spawn_proxy: SpawnProxy) -> None:
    def script(conn: socket.socket, method: str, path: str, body: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n%x\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n"
                     % (len(FIRST), FIRST, len(LAST), LAST))

    with scripted_engine(script) as engine:
        p = spawn_proxy([engine])
        one = request_bytes("POST", "/v1/messages", {"content-type": "application/json"},
                            BODY, close=False)
        with connect(p.url) as sock:
            # (not HTTP: a head too large in the same read as the heads before it is not
            # counted, the bound being looser by one read)
            sock.sendall(one + one + REFUSED["not HTTP"][0])
            got = read_to_end(sock)
    answers = re.split(rb"(?:^|(?<=\r\n))HTTP/1\.1 (?=\d{3} )", got)[1:]
    assert [a[:3] for a in answers] == [b"200", b"200", b"400"]
    assert answers[0].endswith(LAST + b"\r\n0\r\n\r\n")
    assert answers[1].endswith(LAST + b"\r\n0\r\n\r\n")


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the proxy sends until it closes (the refusal closes the connection)."""
    sock.settimeout(10)
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got
