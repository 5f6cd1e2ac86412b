"""A chunked request body's framing and trailer section, over raw loopback sockets against a
real proxy. Each failed on the code before its fix:

- An endless trailer section (``0\\r\\n`` then header lines for ever, or one endless trailer
  value) grew the proxy by about 500 MB a second, before any key was asked: httptools joins a
  field's pieces and uvicorn kept every trailer field. Now the bytes of a chunked body that
  are not body (size lines, extensions, trailers) are bounded like a head: 431, then closed.
- Trailer fields were appended to the request's headers after the app had checked them, and
  forwarded to the engine with the body: now they are dropped (RFC 9110 6.5.1 allows it).
"""

from __future__ import annotations

import socket

import pytest

from tests.server.conftest import ProxyProc, SpawnProxy
from tests.server.hostile import connect, exchange, read_reply, rss_bytes, stand_in_engine

LIMIT = 64 * 1024 + 16 * 1024  # --max-header-bytes + --max-header-line-bytes (the defaults)


def chunked_head(path: str, key: str | None = None) -> bytes:
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    return (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"{auth}transfer-encoding: chunked\r\n\r\n").encode()


def send_until_cut(sock: socket.socket, first: bytes, piece: bytes, most: int) -> int:
    sent = 0
    try:
        sock.sendall(first)
        while sent < most:
            sock.sendall(piece)
            sent += len(piece)
    except OSError:
        pass  # the proxy closed: what was sent up to then is all it took
    return sent


ENDLESS = {
    "trailer lines": (b"2\r\n{}\r\n0\r\n", b"x-t: " + b"a" * 8000 + b"\r\n"),
    "one trailer value": (b"2\r\n{}\r\n0\r\nx-t: ", b"a" * 65536),
    "one chunk extension": (b"2;ext=", b"a" * 65536),
}


@pytest.mark.parametrize("what", list(ENDLESS))
@pytest.mark.parametrize("key", [None, "sekret"])
def test_an_endless_trailer_section_is_cut_off_before_any_key_is_asked(
        spawn_proxy: SpawnProxy, sim_url: str, what: str, key: str | None) -> None:
    env = {"TOPOSERVE_API_KEYS": key} if key else None
    p = spawn_proxy([sim_url], env=env)
    rss_before = rss_bytes(p.pid)
    first, piece = ENDLESS[what]
    with connect(p.url) as sock:  # no key sent either way
        sent = send_until_cut(sock, chunked_head("/v1/chat/completions") + first, piece,
                              256 * 1024 * 1024)
    # Cut at its ~80 KiB limit plus what the kernel buffers: long before 256 MiB.
    assert sent < 32 * 1024 * 1024
    assert rss_bytes(p.pid) < rss_before + 48 * 1024 * 1024
    assert exchange(p.url, "GET", "/health").status == 200


@pytest.mark.parametrize(("path", "shape"), [("/v1/chat/completions", "openai"),
                                             ("/v1/messages", "anthropic")])
def test_a_trailer_section_over_the_limit_is_a_431_in_the_routes_format(
        proxy: ProxyProc, path: str, shape: str) -> None:
    trailers = b"".join(b"x-t%d: %b\r\n" % (i, b"a" * 1000) for i in range(LIMIT // 1000 + 8))
    with connect(proxy.url) as sock:
        # One write: however the proxy's reads split it, every byte after the head is counted
        # (no body byte comes to start the count again).
        sock.sendall(chunked_head(path) + b"0\r\n" + trailers)
        reply = read_reply(sock)
    assert reply.status == 431
    assert reply.closed
    body = reply.json()
    if shape == "anthropic":
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    else:
        assert body["error"]["code"] == "header_too_large"
        message = body["error"]["message"]
    assert "Content-Length" in message
    assert str(LIMIT) in message


def test_trailer_fields_never_reach_the_engine_and_a_small_trailer_section_passes(
        spawn_proxy: SpawnProxy) -> None:
    with stand_in_engine(stream=[b"data: [DONE]\n\n"]) as engine:
        p = spawn_proxy([engine.url])
        body = b'{"model": "stand-in", "input": "hi"}'
        with connect(p.url) as sock:
            sock.sendall(chunked_head("/v1/embeddings") + b"%x\r\n%b\r\n" % (len(body), body)
                         + b"0\r\nx-smuggled: 1\r\nx-data-parallel-rank: 3\r\n\r\n")
            reply = read_reply(sock)
        assert reply.status == 200
        posts = [h for h in engine.heads if h.startswith("POST /v1/embeddings")]
        assert len(posts) == 1
        assert "x-smuggled" not in posts[0].lower()
        assert "x-data-parallel-rank" not in posts[0].lower()


def test_an_app_that_answered_before_the_body_writes_nothing_after_the_431(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    # With a key set and none sent, the app answers 401 without reading the body; when the
    # refusal came first (head and trailers in one read), that answer went to a transport
    # already ended: uvicorn raised 'Cannot call write() after write_eof()', a traceback per
    # request in the proxy's log.
    p = spawn_proxy([sim_url], env={"TOPOSERVE_API_KEYS": "sekret"})
    trailers = b"".join(b"x-t%d: %b\r\n" % (i, b"a" * 1000) for i in range(LIMIT // 1000 + 8))
    with connect(p.url) as sock:
        sock.sendall(chunked_head("/v1/chat/completions") + b"0\r\n" + trailers)
        try:
            status = read_reply(sock).status
        except OSError:  # the 401 went first and the connection was then cut
            status = 401
    assert status in (431, 401)
    assert exchange(p.url, "GET", "/health").status == 200
    assert "Traceback" not in p.log()
