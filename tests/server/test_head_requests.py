"""HEAD through the proxy, over raw sockets: answered at once with the GET's status and headers
and no body, on the proxy's own routes and relayed to the engine (whose answer to HEAD has a
Content-Length and no body: the engine client must not wait for that body until a timeout)."""

from __future__ import annotations

import socket
import time

import pytest

from tests.server.conftest import SpawnProxy
from tests.server.hostile import connect, read_reply, scripted_engine

HOST = "host: 127.0.0.1\r\n"
DECLARED = 1234  # what the engine says a GET's body would be
SLOW = ("--first-byte-timeout", "120", "--idle-timeout", "120")  # far beyond the socket's wait
WAIT_S = 30.0  # well under the timeouts above: an answer only a timeout would give never comes


def engine_script(conn: socket.socket, method: str, path: str, body: bytes) -> None:
    if method == "HEAD":  # as a correct server answers HEAD: the head only
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"x-engine: yes\r\ncontent-length: %d\r\n\r\n" % DECLARED)
    else:
        answer = b'{"version": "0.32.0"}'
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%b" % (len(answer), answer))


def head_then_get(url: str, path: str) -> tuple[bytes, float]:
    """HEAD ``path`` then GET /health on one connection: everything the proxy sent, and how
    long the HEAD's answer took."""
    with connect(url, timeout=WAIT_S) as sock:
        started = time.monotonic()
        sock.sendall(f"HEAD {path} HTTP/1.1\r\n{HOST}\r\n".encode())
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
        took = time.monotonic() - started
        sock.sendall(f"GET /health HTTP/1.1\r\n{HOST}connection: close\r\n\r\n".encode())
        while chunk := sock.recv(65536):
            got += chunk
    return got, took


def split(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split(" ", 2)[1]), headers, rest


@pytest.mark.parametrize("path", ["/version", "/v1/models"])
def test_head_relayed_to_the_engine_is_answered_at_once_with_its_headers_and_no_body(
    spawn_proxy: SpawnProxy, path: str
) -> None:
    with scripted_engine(engine_script) as engine:
        proxy = spawn_proxy([engine], *SLOW)
        raw, took = head_then_get(proxy.url, path)
        status, headers, rest = split(raw)
        assert status == 200, raw
        assert (headers["content-length"], headers["x-engine"]) == (str(DECLARED), "yes")
        # no body: the next bytes are the GET /health's answer on the same connection
        assert rest.startswith(b"HTTP/1.1 200 OK"), rest[:200]
        print(f"HEAD {path} answered in {took * 1000:.0f} ms")
        # the engine's connection that answered HEAD is not reused wrongly: a GET still works
        with connect(proxy.url) as sock:
            sock.sendall(f"GET /version HTTP/1.1\r\n{HOST}connection: close\r\n\r\n".encode())
            assert read_reply(sock).json() == {"version": "0.32.0"}


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics"])
def test_head_on_the_proxys_own_routes_has_the_gets_status_and_headers_and_no_body(
    spawn_proxy: SpawnProxy, path: str
) -> None:
    with scripted_engine(engine_script) as engine:
        proxy = spawn_proxy([engine], *SLOW)
        with connect(proxy.url) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\n{HOST}connection: close\r\n\r\n".encode())
            got = read_reply(sock)
        raw, _ = head_then_get(proxy.url, path)
        status, headers, rest = split(raw)
        assert status == got.status == 200
        assert headers["content-type"] == got.headers["content-type"]
        assert "content-length" in headers
        assert rest.startswith(b"HTTP/1.1 200 OK"), rest[:200]
