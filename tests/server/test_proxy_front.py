"""server.front: which requests its lean path serves, and that everything else reaches uvicorn
intact, on one connection and in order.

The proxy runs in this process (uvicorn in a thread, the real config of ``python -m server``) so
that the test can count the lean path's exchanges; the engine is the simulated one.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httptools
import pytest
import uvicorn

from server import front
from server.config import ProxyConfig
from server.serve import uvicorn_config
from tests.server.conftest import free_port


@dataclass
class Front:
    host: str
    port: int
    lean: list[int] = field(default_factory=list)  # one entry per lean exchange


@pytest.fixture
def served(sim_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Front]:
    port = free_port()
    result = Front("127.0.0.1", port)
    made = front.Exchange.__init__

    def counting(self: front.Exchange, *args: object) -> None:
        result.lean.append(1)
        made(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(front.Exchange, "__init__", counting)
    server = uvicorn.Server(uvicorn_config(ProxyConfig(upstreams=(sim_url,), port=port),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the in-process proxy did not start"
    try:
        yield result
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def post(path: str, body: dict[str, object], *extra: bytes, version: bytes = b"1.1") -> bytes:
    data = json.dumps(body).encode()
    head = [b"POST %s HTTP/%s" % (path.encode(), version), b"host: 127.0.0.1",
            b"content-type: application/json", b"content-length: %d" % len(data), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + data


def get(path: str, *extra: bytes) -> bytes:
    return b"\r\n".join([b"GET %s HTTP/1.1" % path.encode(), b"host: 127.0.0.1", *extra]) + (
        b"\r\n\r\n")


@dataclass
class Reply:
    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""


class _Replies:
    def __init__(self) -> None:
        self.done: list[Reply] = []
        self.current = Reply()
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.current.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.current.body += body

    def on_message_complete(self) -> None:
        if self.current.status >= 200:  # a 100 Continue is not the answer
            self.done.append(self.current)
        self.current = Reply()


def exchange(served: Front, *requests: bytes, expect: int, sock: socket.socket | None = None
             ) -> list[Reply]:
    """Write the requests in one go; read until ``expect`` complete replies arrived."""
    own = sock is None
    sock = sock or socket.create_connection((served.host, served.port), timeout=10)
    try:
        sock.sendall(b"".join(requests))
        replies = _Replies()
        while len(replies.done) < expect:
            chunk = sock.recv(65536)
            if not chunk:
                break
            replies.parser.feed_data(chunk)
        return replies.done
    finally:
        if own:
            sock.close()


STREAM = {"model": "sim-model", "prompt": "hi", "max_tokens": 3, "stream": True}
PLAIN = {"model": "sim-model", "prompt": "hi", "max_tokens": 3}


def test_generation_requests_take_the_lean_path(served: Front) -> None:
    (streamed,) = exchange(served, post("/v1/completions", STREAM, b"connection: close"),
                           expect=1)
    assert streamed.status == 200
    assert streamed.headers[b"content-type"].startswith(b"text/event-stream")
    assert b"date" in streamed.headers
    assert b"x-request-id" in streamed.headers
    events = [e for e in streamed.body.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert len(events) == 4  # three tokens, [DONE]: the usage chunk the proxy asked for is gone
    (whole,) = exchange(served, post("/v1/chat/completions", {
        "model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2}), expect=1)
    assert whole.status == 200
    assert json.loads(whole.body)["usage"]["completion_tokens"] == 2
    assert len(served.lean) == 2


def test_one_connection_serves_lean_requests_then_hands_other_routes_to_uvicorn(
        served: Front) -> None:
    with socket.create_connection((served.host, served.port), timeout=10) as sock:
        for _ in range(3):  # keep-alive between lean requests
            (r,) = exchange(served, post("/v1/completions", STREAM), expect=1, sock=sock)
            assert r.status == 200
            assert r.body.endswith(b"data: [DONE]\n\n")
        (models,) = exchange(served, get("/v1/models"), expect=1, sock=sock)
        assert models.status == 200
        assert json.loads(models.body)["data"]
        (after,) = exchange(served, post("/v1/completions", STREAM), expect=1, sock=sock)
        assert after.status == 200
        assert after.body.endswith(b"data: [DONE]\n\n")
    assert len(served.lean) == 3  # the connection is uvicorn's from /v1/models on


def test_pipelined_requests_are_answered_in_order(served: Front) -> None:
    replies = exchange(served, post("/v1/completions", STREAM), post("/v1/completions", PLAIN),
                       get("/health"), post("/v1/completions", STREAM, b"connection: close"),
                       expect=4)
    assert [r.status for r in replies] == [200, 200, 200, 200]
    assert replies[0].body.endswith(b"data: [DONE]\n\n")
    assert json.loads(replies[1].body)["object"] == "text_completion"
    assert json.loads(replies[2].body) == {"status": "ok"}
    assert replies[3].body.endswith(b"data: [DONE]\n\n")
    assert len(served.lean) == 2


def _chunked(body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json"
            b"\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))


@pytest.mark.parametrize(("request_bytes", "status"), [
    (_chunked(PLAIN), 200),  # a chunked request body
    (post("/v1/completions", PLAIN, version=b"1.0"), 200),
    (post("/v1/completions", PLAIN, b"expect: 100-continue"), 200),
    (get("/v1/completions"), 405),
    (post("/v1/completions/", PLAIN), 404),
    (b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
     b"content-length: 1\r\ncontent-length: 2\r\n\r\n",
     400),  # httptools refuses it: uvicorn's 400
])
def test_requests_the_lean_path_does_not_take_reach_uvicorn_intact(
        served: Front, request_bytes: bytes, status: int) -> None:
    (reply,) = exchange(served, request_bytes, expect=1)
    assert reply.status == status
    if status == 200:
        assert json.loads(reply.body)["usage"]["completion_tokens"] == 3
    assert served.lean == []


def test_idle_keep_alive_connection_is_kept_then_reused(served: Front) -> None:
    with socket.create_connection((served.host, served.port), timeout=10) as sock:
        (first,) = exchange(served, post("/v1/completions", PLAIN), expect=1, sock=sock)
        time.sleep(0.3)  # idle between requests: neither the header timer nor a stale state
        (second,) = exchange(served, post("/v1/completions", PLAIN), expect=1, sock=sock)
    assert first.status == second.status == 200
    assert first.headers[b"x-request-id"] != second.headers[b"x-request-id"]
    assert len(served.lean) == 2
