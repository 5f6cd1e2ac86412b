"""topocommon.http1.ClientConnection, the one HTTP/1.1 client connection of the proxy
(server.upstream), loadgen (loadgen.transport) and the benchmark client (simengine.client):
generated answers split anywhere read the same as whole, and each of the two clients that moved
onto it holds against a hostile server over raw loopback sockets (the proxy's side is
tests/server/test_http_layers.py)."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.transport import Client, Endpoint, request_bytes
from simengine.client import stream
from tests.server.hostile import scripted_engine, sse_chunks
from topocommon import http1


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.closing = True

    def close(self) -> None:
        self.closing = True


class _Recorder:
    def __init__(self) -> None:
        self.head: tuple[int, http1.Headers] | None = None
        self.body = b""
        self.complete = False
        self.lost: list[str | None] = []

    def on_head(self, status: int, headers: http1.Headers, keep_alive: bool) -> None:
        self.head = (status, list(headers))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_complete(self) -> None:
        self.complete = True

    def on_lost(self, error: http1.BadResponse | None) -> None:
        self.lost.append(None if error is None else str(error))


def _read(pieces: list[bytes], close: bool, method: str = "POST") -> _Recorder:
    async def run() -> _Recorder:
        conn = http1.ClientConnection()
        conn.connection_made(_Transport())
        rec = _Recorder()
        conn.start(rec, method)
        for piece in pieces:
            conn.data_received(piece)
        if close:
            conn.connection_lost(None)
        return rec
    return asyncio.run(run())


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(data)})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@settings(max_examples=150, deadline=None)
@given(body=st.binary(max_size=300),
       framing=st.sampled_from(["sized", "chunked", "close"]),
       interim=st.lists(st.sampled_from([b"100 Continue", b"103 Early Hints"]), max_size=2),
       trailers=st.booleans(),
       chunk=st.integers(1, 64),
       cuts=st.lists(st.integers(0, 800), max_size=10))
def test_any_split_of_any_answer_reads_as_the_whole(
        body: bytes, framing: str, interim: list[bytes], trailers: bool, chunk: int,
        cuts: list[int]) -> None:
    wire = b"".join(b"HTTP/1.1 %b\r\nlink: </a>\r\n\r\n" % i for i in interim)
    head = b"HTTP/1.1 200 OK\r\nx-a: 1\r\n"
    if framing == "sized":
        wire += head + b"content-length: %d\r\n\r\n" % len(body) + body
    elif framing == "chunked":
        parts = [body[i:i + chunk] for i in range(0, len(body), chunk)]
        wire += head + b"transfer-encoding: chunked\r\n\r\n" + b"".join(
            b"%x\r\n%b\r\n" % (len(p), p) for p in parts)
        wire += b"0\r\nx-trailer: t\r\n\r\n" if trailers else b"0\r\n\r\n"
    else:
        wire += b"HTTP/1.0 200 OK\r\nx-a: 1\r\n\r\n" + body
    rec = _read(_cut(wire, cuts), close=framing == "close")
    assert rec.head is not None
    status, headers = rec.head
    assert status == 200
    assert (b"x-a", b"1") in headers
    assert b"link" not in dict(headers)  # an interim answer's headers are not the answer's
    assert b"x-trailer" not in dict(headers)
    assert rec.body == body
    assert rec.complete
    assert rec.lost == []


@settings(max_examples=60, deadline=None)
@given(cut_at=st.integers(0, 200), framing=st.sampled_from(["sized", "chunked"]))
def test_an_answer_cut_short_is_lost_never_complete(cut_at: int, framing: str) -> None:
    body = b"x" * 100
    wire = (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + body if framing == "sized"
            else b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n64\r\n" + body
            + b"\r\n0\r\n\r\n")
    rec = _read([wire[:min(cut_at, len(wire) - 1)]], close=True)
    assert not rec.complete
    assert rec.lost == [None]


@given(status=st.sampled_from([b"000", b"099", b"600", b"999"]))
def test_a_status_outside_100_to_599_is_a_bad_response(status: bytes) -> None:
    rec = _read([b"HTTP/1.1 %b X\r\ncontent-length: 0\r\n\r\n" % status], close=False)
    assert rec.head is None
    assert len(rec.lost) == 1
    assert rec.lost[0] is not None


def test_a_head_over_the_bound_is_a_bad_response_at_once() -> None:
    pieces = [b"HTTP/1.1 200 OK\r\n"] + [b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(700)]
    rec = _read(pieces, close=False)
    assert rec.head is None
    assert rec.lost == [f"the server's response head is over {http1.MAX_HEAD_BYTES} bytes"]


def test_the_answer_to_head_ends_with_its_head() -> None:
    rec = _read([b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n"], close=False, method="HEAD")
    assert rec.complete
    assert rec.body == b""


# -- the two clients that moved onto it, against hostile servers on raw sockets -------------------

def _endless_head(conn: socket.socket, method: str, path: str, body: bytes) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:  # until the client hangs up
            conn.sendall(b"x-h: " + b"v" * 1000 + b"\r\n")
    except OSError:
        return


def test_loadgen_gets_an_error_at_once_from_a_server_sending_an_endless_head() -> None:
    with scripted_engine(_endless_head) as url:
        endpoint = Endpoint.parse(url)

        async def run() -> tuple[str | None, float]:
            client = Client(endpoint, timeout_s=30)
            t0 = time.monotonic()
            raw = await client.send(0, request_bytes(endpoint, "/v1/completions", b"{}", None))
            client.close()
            return raw.error, time.monotonic() - t0
        error, took = asyncio.run(run())
    assert error is not None
    assert "over 65536 bytes" in error
    assert took < 15  # not the 30 s timeout (before: memory grew until it)


def _interim_then_sse(conn: socket.socket, method: str, path: str, body: bytes) -> None:
    conn.sendall(b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + sse_chunks(
        [b'data: {"choices":[{"text":"a"}]}\r\r', b'data: {"choices":[{"text":"b"}]}\r\r',
         b"data: [DONE]\r\r"]))


def test_the_benchmark_client_reads_past_an_interim_answer_and_bare_cr_events() -> None:
    with scripted_engine(_interim_then_sse) as url:
        result = asyncio.run(stream(url + "/v1/completions", {"stream": True}, timeout=20))
    assert result.error is None
    assert result.status == 200
    assert result.done
    assert len(result.token_times) == 2


def test_loadgen_reads_past_an_interim_answer_and_bare_cr_events() -> None:
    from loadgen.sse import timed_events

    with scripted_engine(_interim_then_sse) as url:
        endpoint = Endpoint.parse(url)

        async def run() -> Any:
            client = Client(endpoint, timeout_s=20)
            raw = await client.send(0, request_bytes(endpoint, "/v1/completions", b"{}", None))
            client.close()
            return raw
        raw = asyncio.run(run())
    assert raw.error is None
    assert raw.status == 200
    assert [data for _, data in timed_events(raw.pieces)] == [
        b'{"choices":[{"text":"a"}]}', b'{"choices":[{"text":"b"}]}', b"[DONE]"]
