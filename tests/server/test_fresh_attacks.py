"""Attacks beyond issue 25's list, each over raw loopback sockets against a real proxy (a hostile
engine from tests.server.hostile.scripted_engine, or a hostile client). Each failed on the code
before its fix (b0e451b).

- An engine that writes bytes after its answer ended (a second, unasked-for response, or the
  start of one): they reached the client after its stream or answer, or broke the next request
  sent on that connection. A connection that answers what it was not asked is out of step with
  its requests: it is closed, as mature clients do, and what it sent is dropped.
- A request the HTTP parser refuses (CL with TE, obs-fold, a NUL in a header, an HTTP/2
  preface...) got uvicorn's plain-text ``Invalid HTTP request received.`` and a close that could
  reset the answer away: now the route's error format (Anthropic's on /v1/messages) and the
  same lingering close as every other refusal.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time
from typing import Any

import httpx
import pytest

import server.app as app_mod
from server.app import THREAD_BODY_BYTES, create_app
from server.config import ProxyConfig
from server.uvicorn_adapter import MAX_PIPELINED
from tests.server.conftest import ProxyProc, SpawnProxy
from tests.server.hostile import (
    address,
    connect,
    exchange,
    json_answer,
    post_json,
    read_reply,
    rss_bytes,
    scripted_engine,
    sse_chunks,
    wait_for,
)
from tests.server.test_http_layers import ANSWER, CHAT
from tests.server.test_local_guard import MESSAGES, raw

TOKEN = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
         b'"delta":{"content":"tok"},"finish_reason":null}]}\n\n')
MESSAGES_STREAM = {"model": "sim-model", "max_tokens": 30000, "stream": True,
                   "messages": [{"role": "user", "content": "hi"}]}
STRAY = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 12\r\n\r\n"
         b"data: EVIL\n\n")


# -- an engine answering what it was not asked -----------------------------------------------

@pytest.mark.parametrize(("path", "events"), [
    ("/v1/chat/completions", [TOKEN, b"data: [DONE]\n\n"]),
    ("/v1/messages", [b'event: message_start\ndata: {"type": "message_start"}\n\n',
                      b'event: message_stop\ndata: {"type": "message_stop"}\n\n']),
    ("/v1/responses", [b'event: response.completed\ndata: {"type": "response.completed"}\n\n']),
])
def test_bytes_after_the_engines_stream_ended_never_reach_the_client(
        spawn_proxy: SpawnProxy, path: str, events: list[bytes]) -> None:
    def script(conn: socket.socket, method: str, target: str, body: bytes) -> None:
        conn.sendall(sse_chunks(events) + STRAY)  # the stray answer in the same write

    with scripted_engine(script) as engine:
        p = spawn_proxy([engine])
        reply = post_json(p.url, path, {**CHAT, "stream": True, "max_tokens": 5})
        assert reply.status == 200
        assert reply.body == b"".join(events)


def test_bytes_after_a_large_answer_ended_never_reach_the_client(spawn_proxy: SpawnProxy) -> None:
    # Over 1 MiB: relayed as it arrives, with the engine's Content-Length.
    big = json.dumps({**ANSWER, "filler": "y" * (2 << 20)}).encode()

    def script(conn: socket.socket, method: str, target: str, body: bytes) -> None:
        conn.sendall(json_answer(big) + b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nEVIL!")

    with scripted_engine(script) as engine:
        p = spawn_proxy([engine])
        reply = post_json(p.url, "/v1/chat/completions", CHAT)
        assert (reply.status, reply.body) == (200, big)
        assert "Traceback" not in p.log()
        assert "internal error" not in p.log()


def test_a_connection_that_starts_an_unasked_answer_is_not_reused(spawn_proxy: SpawnProxy) -> None:
    body = json.dumps(ANSWER).encode()
    answered = [0]

    def script(conn: socket.socket, method: str, target: str, req: bytes) -> None:
        answered[0] += 1
        conn.sendall(json_answer(body))
        if answered[0] == 1:  # then, while the connection idles, the head of another answer
            time.sleep(0.2)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")

    with scripted_engine(script) as engine:
        p = spawn_proxy([engine], "--first-byte-timeout", "30", "--health-interval", "60")
        assert post_json(p.url, "/v1/chat/completions", CHAT).status == 200
        time.sleep(0.6)
        t0 = time.monotonic()
        reply = post_json(p.url, "/v1/chat/completions", CHAT)
        assert (reply.status, reply.body) == (200, body)
        assert time.monotonic() - t0 < 5


# -- requests the HTTP parser refuses ---------------------------------------------------------

UNPARSABLE = {
    "content-length and chunked": (b"content-length: 4\r\ntransfer-encoding: chunked\r\n\r\n"
                                   b"0\r\n\r\n"),
    "obs-fold": b"x-a: b\r\n c\r\ncontent-length: 0\r\n\r\n",
    "NUL in a header": b"x-a: b\x00c\r\ncontent-length: 0\r\n\r\n",
    "space before the colon": b"transfer-encoding : chunked\r\n\r\n0\r\n\r\n",
    "chunk size overflow": b"transfer-encoding: chunked\r\n\r\nfffffffffffffffffff\r\nab",
}


@pytest.mark.parametrize("what", list(UNPARSABLE))
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/v1/messages"])
def test_a_request_the_parser_refuses_gets_the_routes_error_format(
        spawn_proxy: SpawnProxy, sim_url: str, what: str, path: str) -> None:
    p = spawn_proxy([sim_url])
    method = b"GET" if path == "/v1/models" else b"POST"
    with connect(p.url) as sock:
        sock.sendall(b"%b %b HTTP/1.1\r\nhost: 127.0.0.1\r\n" % (method, path.encode())
                     + UNPARSABLE[what] + b"x" * 200_000)  # and more the proxy will not read
        reply = read_reply(sock)
    assert reply.status == 400
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    if path == "/v1/messages":
        assert reply.json()["type"] == "error"
        assert error["type"] == "invalid_request_error"
    else:
        assert error["code"] == "invalid_http"
    assert "HTTP/1.1" in error["message"]
    assert reply.closed


def test_an_http2_preface_gets_a_json_400_naming_http_1_1(spawn_proxy: SpawnProxy,
                                                          sim_url: str) -> None:
    p = spawn_proxy([sim_url])
    with connect(p.url) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        reply = read_reply(sock)
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "invalid_http"


# -- SIGTERM past --drain-timeout while bodies still arrive ----------------------------------

def test_requests_cut_at_shutdown_before_their_answer_get_a_503_and_no_traceback(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--drain-timeout", "1")
    slow = []  # heads sent, bodies never finished: still being read when the drain ends
    for path, framing in [("/v1/chat/completions", b"content-length: 1000\r\n\r\n{"),
                          ("/v1/chat/completions", b"transfer-encoding: chunked\r\n\r\n1\r\n{\r\n"),
                          ("/v1/messages", b"content-length: 1000\r\n\r\n{")]:
        sock = connect(p.url, timeout=20)
        sock.sendall(b"POST %b HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                     % path.encode() + framing)
        slow.append((path, sock))
    stream = connect(p.url, timeout=20)
    stream.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: "
                   b"application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%b" % (
                       len(body := json.dumps(MESSAGES_STREAM).encode()), body))
    assert stream.recv(65536).startswith(b"HTTP/1.1 200")
    time.sleep(0.3)
    os.kill(p.pid, signal.SIGTERM)
    for path, sock in slow:
        with sock:
            reply = read_reply(sock, timeout=20)
        assert reply.status == 503, (path, reply.body)
        assert reply.headers["retry-after"]
        answer = reply.json()
        error = answer["error"]
        assert "shutting down" in error["message"]
        if path == "/v1/messages":
            assert answer["type"] == "error"
            assert error["type"] == "overloaded_error"
    got = b""
    with stream:
        while chunk := stream.recv(65536):
            got += chunk
    assert b"event: error" in got
    assert got.endswith(b"0\r\n\r\n")
    assert wait_for(lambda: "Finished server process" in p.log(), timeout=20)
    assert "Traceback" not in p.log()
    assert "Exception in ASGI application" not in p.log()


# -- deep pipelining on the routes uvicorn serves ----------------------------------------------

def test_a_read_of_pipelined_requests_queues_a_bounded_number(spawn_proxy: SpawnProxy,
                                                              sim_url: str) -> None:
    p = spawn_proxy([sim_url])
    one = b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
    flood = one * (256 * 1024 // len(one))  # 6,393 requests in one write
    before = rss_bytes(p.pid)
    socks = []
    try:
        for _ in range(10):  # clients that send and do not read
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(address(p.url))
            sock.sendall(flood)
            socks.append(sock)
        time.sleep(2)
        grown = rss_bytes(p.pid) - before
        assert exchange(p.url, "GET", "/health", timeout=5).status == 200
    finally:
        for sock in socks:
            sock.close()
    assert grown < 40 << 20, f"RSS grew {grown >> 20} MiB"  # ~300 MiB at ecd2510
    with connect(p.url) as sock:  # a pipelining client gets the queued answers, then the close
        sock.sendall(one * 40)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    assert got.count(b"HTTP/1.1 200 OK") == MAX_PIPELINED + 1
    assert got.endswith(b'{"status":"ok"}')


# -- the Host an absolute-form target names ----------------------------------------------------

@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("POST", "/v1/messages")])
def test_an_absolute_form_target_naming_another_host_is_refused_on_loopback(
        proxy: ProxyProc, sim_url: str, method: str, path: str) -> None:
    body = json.dumps(MESSAGES).encode() if method == "POST" else b""
    status, _, answer = raw(proxy.url, method, f"http://attacker.example{path}",
                            [("host", "127.0.0.1"), ("content-type", "application/json")], body)
    assert status == 403  # RFC 9112 3.2.2: the target's authority is the request's Host
    assert "--allowed-hosts" in json.dumps(answer)  # either dialect
    status, _, _ = raw(proxy.url, method, f"http://127.0.0.1:8000{path}",
                       [("host", "attacker.example"), ("content-type", "application/json")],
                       body)
    assert status == 200


# -- cross-site loads without Origin -----------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/v1/chat/completions"])
def test_a_cross_site_load_without_origin_is_refused_but_a_navigation_is_served(
        proxy: ProxyProc, sim_url: str, path: str) -> None:
    method = "POST" if path == "/v1/chat/completions" else "GET"
    body = json.dumps({**MESSAGES}).encode() if method == "POST" else b""
    base = [("host", "127.0.0.1"), ("content-type", "application/json")]
    status, _, answer = raw(proxy.url, method, path, [
        *base, ("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "no-cors")], body)
    assert status == 403
    assert answer["error"]["code"] == "cross_site_request"
    for fetch in ([("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "navigate")],
                  [("sec-fetch-site", "same-origin"), ("sec-fetch-mode", "cors")],
                  [("sec-fetch-site", "none")], []):
        status, _, _ = raw(proxy.url, method, path, [*base, *fetch], body)
        assert status == 200, fetch


# -- a relayed body that names a URL is parsed off the event loop ------------------------------

@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
def test_health_answers_while_a_large_relayed_body_is_checked_for_media(
        proxy: ProxyProc, sim_url: str, path: str) -> None:
    # 1.8 M small objects and one internal URL (refused: the engine never sees it)
    body = (b'{"model": "sim-model", "max_tokens": 2, "x": [' + b",".join([b"{\"a\":{}}"] * 900_000)
            + b'], "y": {"url": "http://127.0.0.1/"}}')
    slowest = [0.0]
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            assert exchange(proxy.url, "GET", "/health", timeout=30).status == 200
            slowest[0] = max(slowest[0], time.monotonic() - t0)
            time.sleep(0.01)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        for _ in range(2):
            reply = exchange(proxy.url, "POST", path, {"content-type": "application/json"},
                             body, timeout=60)
            assert reply.status == 400
            assert "--allow-internal-media" in reply.body.decode()
    finally:
        done.set()
        prober.join()
    # No bound on the time here (benchmarks time; a loaded CI machine would make any bound
    # flaky): /health answered all through, and where the work runs is checked below. Measured
    # on a 2-core machine: /health's slowest 0.17-0.26 s with the body inspected in the thread,
    # 0.68-0.72 s at ff99a02 (parsed in the thread, walked and freed on the event loop).
    assert slowest[0] > 0.0


@pytest.mark.parametrize(("pad", "off_loop"), [(THREAD_BODY_BYTES, True), (1000, False)])
def test_a_large_relayed_body_is_parsed_walked_and_freed_off_the_event_loop(
        monkeypatch: pytest.MonkeyPatch, pad: int, off_loop: bool) -> None:
    """The mechanism behind the test above, in process: a body of THREAD_BODY_BYTES or more is
    inspected (parsed, searched for media URLs, its model read) in a worker thread, which hands
    the event loop back only the refusal and the model name, never the parsed tree (freeing a
    million objects on the loop held it as long as parsing them); a small one stays on the loop."""
    ran_in: list[int] = []
    real = app_mod._inspect_body

    def spy(body: bytes, media: bool) -> tuple[Any, str | None]:
        ran_in.append(threading.get_ident())
        got = real(body, media)
        assert isinstance(got, tuple)
        assert len(got) == 2
        assert got[1] is None or isinstance(got[1], str)
        return got

    monkeypatch.setattr(app_mod, "_inspect_body", spy)
    app = create_app(ProxyConfig(upstreams=("http://127.0.0.1:1",)))
    body = (b'{"model": "m", "max_tokens": 2, "pad": "' + b"x" * pad
            + b'", "y": {"url": "http://127.0.0.1/"}}')

    async def post() -> tuple[int, str, int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1:8000") as client:
            r = await client.post("/v1/messages", content=body,
                                  headers={"content-type": "application/json"})
            return r.status_code, r.text, threading.get_ident()

    status, text, loop_thread = asyncio.run(post())
    assert status == 400
    assert "--allow-internal-media" in text
    assert len(ran_in) == 1
    assert (ran_in[0] != loop_thread) is off_loop


# -- media URLs: more spellings of inside -----------------------------------------------------

@pytest.mark.parametrize("url", [
    "http://[::ffff:0:127.0.0.1]/", "http://[::ffff:0:a9fe:a9fe]/latest/meta-data/",
    "http://[::127.0.0.1]/", "http://[::7f00:1]:8000/v1/models", "http://[64:ff9b:1::a00:1]/",
    "http://kubernetes.default.svc/", "http://redis.cache.svc:6379/"])
def test_reserved_ipv6_spellings_and_cluster_service_names_are_refused_as_media(
        proxy: ProxyProc, sim_url: str, url: str) -> None:
    content = [{"type": "image_url", "image_url": {"url": url}}]
    status, _, answer = raw(proxy.url, "POST", "/v1/chat/completions",
                            [("host", "127.0.0.1"), ("content-type", "application/json")],
                            json.dumps({**MESSAGES, "messages": [
                                {"role": "user", "content": content}]}).encode())
    assert status == 400
    assert answer["error"]["code"] == "internal_media_url"
