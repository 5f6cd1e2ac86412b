"""Issue 25's attacks on the proxy's HTTP layers, each over raw loopback sockets: a hostile
engine (tests.server.hostile.scripted_engine writes whatever bytes it likes) or a hostile
client, against a real proxy process. Each failed on the code before the fix (cbe57b9).

Broken: endless response headers, one endless header line, a lone CRLF switching off the
timeouts of uvicorn's routes, ``Expect: 100-continue`` before ``Content-Length``, a steady
reader of a large answer cut off as a stall, a truncated ``/v1/messages`` stream passing as
whole, interim 1xx answers. Weak: negative usage, trailers, status 000, an HTTP/1.0 answer
delimited by the close, bare-CR SSE, SIGTERM past --drain-timeout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable

import pytest

from tests.server.conftest import SpawnProxy
from tests.server.hostile import (
    Script,
    connect,
    exchange,
    json_answer,
    metrics_text,
    post_json,
    read_reply,
    request_bytes,
    rss_bytes,
    scripted_engine,
    sse_chunks,
    wait_for,
)
from tests.server.test_proxy_weak import metric

CHAT = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = {"id": "c", "object": "chat.completion", "model": "scripted",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                       "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def answering(raw: bytes | Callable[[socket.socket], None], close: bool = False) -> Script:
    def script(conn: socket.socket, method: str, path: str, body: bytes) -> None:
        if callable(raw):
            raw(conn)
        else:
            conn.sendall(raw)
        if close:
            conn.shutdown(socket.SHUT_WR)
            time.sleep(0.5)
            conn.close()
    return script


def endless(first: bytes, line: Callable[[int], bytes]) -> Callable[[socket.socket], None]:
    def write(conn: socket.socket) -> None:
        conn.sendall(first)
        deadline = time.monotonic() + 20
        i = 0
        while time.monotonic() < deadline:  # until the proxy hangs up
            conn.sendall(line(i))
            i += 1
    return write


# -- Broken 1, 2: endless response heads ----------------------------------------------------------

@pytest.mark.parametrize("kind", ["header lines", "one line"])
def test_an_engine_sending_an_endless_head_gets_a_502_at_once_and_bounded_memory(
        spawn_proxy: SpawnProxy, kind: str) -> None:
    line = ((lambda i: b"x-h%d: %s\r\n" % (i, b"v" * 100)) if kind == "header lines"
            else (lambda i: b"v" * 65536))
    first = b"HTTP/1.1 200 OK\r\n" + (b"x-long: " if kind == "one line" else b"")
    with scripted_engine(answering(endless(first, line))) as engine:
        p = spawn_proxy([engine], "--first-byte-timeout", "600")
        before = rss_bytes(p.pid)
        t0 = time.monotonic()
        reply = post_json(p.url, "/v1/chat/completions", CHAT)
        assert reply.status == 502, reply.body
        assert time.monotonic() - t0 < 10  # not the 600 s first-byte timeout
        assert "head" in reply.json()["error"]["message"]
        assert rss_bytes(p.pid) - before < 50 << 20
        assert exchange(p.url, "GET", "/health").status == 200
        assert metric(metrics_text(p.url), "toposerve_upstream_errors_total",
                      kind="malformed") == 1.0


# -- Broken 3: a lone CRLF after an answered request ----------------------------------------------

def test_a_lone_crlf_after_an_answered_request_does_not_switch_off_the_timeouts(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--header-timeout", "1")
    with connect(p.url) as sock:
        sock.sendall(request_bytes("GET", "/v1/models", close=False))  # a uvicorn route
        assert read_reply(sock, see_close=False).status == 200
        sock.sendall(b"\r\n")
        sock.settimeout(20)  # header timeout 1 s: closed well before this; keep-alive is 75 s
        t0 = time.monotonic()
        assert sock.recv(1) == b""
        assert time.monotonic() - t0 < 15


# -- Broken 4: Expect: 100-continue before Content-Length -----------------------------------------

@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_expect_100_continue_is_answered_whatever_the_header_order(
        spawn_proxy: SpawnProxy, sim_url: str, path: str) -> None:
    p = spawn_proxy([sim_url])
    body = json.dumps({"model": "sim-model", "max_tokens": 2, "prompt": "a",
                       "messages": [{"role": "user", "content": "a"}]}).encode()
    with connect(p.url) as sock:
        sock.sendall(b"POST %b HTTP/1.1\r\nhost: 127.0.0.1\r\nexpect: 100-continue\r\n"
                     b"content-type: application/json\r\ncontent-length: %d\r\n"
                     b"connection: close\r\n\r\n"
                     % (path.encode(), len(body)))
        sock.settimeout(10)  # the client waits for the 100 before sending its body
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n")
        sock.sendall(body)
        assert read_reply(sock).status == 200


# -- Broken 5, Weak 1: a large non-streamed answer to a steady reader -----------------------------

def test_a_steady_reader_of_a_large_answer_gets_it_whole(spawn_proxy: SpawnProxy) -> None:
    text = "y" * (12 << 20)
    big = json.dumps({**ANSWER, "choices": [{"index": 0, "message": {
        "role": "assistant", "content": text}, "finish_reason": "length"}]}).encode()
    with scripted_engine(answering(json_answer(big))) as engine:
        p = spawn_proxy([engine], "--client-stall-timeout", "3")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        host, port = p.url.removeprefix("http://").split(":")
        sock.connect((host, int(port)))
        with sock:
            payload = json.dumps(CHAT).encode()
            sock.sendall(request_bytes("POST", "/v1/chat/completions",
                                       {"content-type": "application/json"}, payload))
            got, peak = b"", 0
            sock.settimeout(30)
            while chunk := sock.recv(32 * 1024):  # ~2.5 MB/s: one buffered write took ~5 s
                got += chunk
                time.sleep(0.0125)
                if len(got) % (1 << 20) < 32 * 1024:
                    peak = max(peak, rss_bytes(p.pid))
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert body == big
        text_metrics = metrics_text(p.url)
        assert metric(text_metrics, "toposerve_client_stalls_total") in (None, 0.0)
        assert metric(text_metrics, "toposerve_prompt_tokens_total", model="scripted") == 3.0


# -- Broken 6: a truncated /v1/messages stream ----------------------------------------------------

def test_a_messages_stream_cut_after_a_delta_whose_text_is_message_stop_gets_an_error(
        spawn_proxy: SpawnProxy) -> None:
    delta = {"type": "content_block_delta", "index": 0,
             "delta": {"type": "text_delta", "text": "message_stop"}}
    events = [b'event: message_start\ndata: {"type": "message_start"}\n\n',
              b"event: content_block_delta\ndata: " + json.dumps(delta).encode() + b"\n\n"]
    with scripted_engine(answering(sse_chunks(events))) as engine:
        p = spawn_proxy([engine])
        reply = post_json(p.url, "/v1/messages", {**CHAT, "stream": True, "max_tokens": 5})
        assert reply.status == 200
        assert reply.body.rstrip().split(b"\n\n")[-1].startswith(b"event: error\n")


def test_a_messages_stream_ending_in_message_stop_passes_unchanged(
        spawn_proxy: SpawnProxy) -> None:
    events = [b'event: message_start\ndata: {"type": "message_start"}\n\n',
              b'event: message_stop\r\ndata: {"type": "message_stop"}\r\n\r\n']
    with scripted_engine(answering(sse_chunks(events))) as engine:
        p = spawn_proxy([engine])
        reply = post_json(p.url, "/v1/messages", {**CHAT, "stream": True, "max_tokens": 5})
        assert reply.body == b"".join(events)


# -- Broken 7: interim responses ------------------------------------------------------------------

def test_interim_responses_from_the_engine_are_skipped_for_the_final_one(
        spawn_proxy: SpawnProxy) -> None:
    body = json.dumps(ANSWER).encode()
    raw = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </s.css>\r\n\r\n"
           + json_answer(body))
    with scripted_engine(answering(raw)) as engine:
        p = spawn_proxy([engine])
        reply = post_json(p.url, "/v1/chat/completions", CHAT)
        assert reply.status == 200
        assert reply.body == body
        assert "link" not in reply.headers


def test_an_engine_switching_protocols_gets_a_502(spawn_proxy: SpawnProxy) -> None:
    raw = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n"
    with scripted_engine(answering(raw)) as engine:
        p = spawn_proxy([engine])
        reply = post_json(p.url, "/v1/chat/completions", CHAT)
        assert reply.status == 502
        assert "switched protocols" in reply.json()["error"]["message"]
        assert "Traceback" not in p.log()


# -- Weak: negative usage -------------------------------------------------------------------------

def test_negative_usage_is_not_counted_and_the_answer_passes(spawn_proxy: SpawnProxy) -> None:
    body = json.dumps({**ANSWER, "usage": {"prompt_tokens": -5, "completion_tokens": 2}}).encode()
    with scripted_engine(answering(json_answer(body))) as engine:
        p = spawn_proxy([engine])
        reply = post_json(p.url, "/v1/chat/completions", CHAT)
        assert (reply.status, reply.body) == (200, body)
        assert metric(metrics_text(p.url), "toposerve_prompt_tokens_total",
                      model="scripted") in (None, 0.0)


def test_negative_usage_in_a_stream_loses_no_token(spawn_proxy: SpawnProxy) -> None:
    token = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
             b'"delta":{"content":"tok"},"finish_reason":null}]}\n\n')
    usage = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":-1,"completion_tokens":1}}\n\n'
    with scripted_engine(answering(sse_chunks([token + usage, b"data: [DONE]\n\n"]))) as engine:
        p = spawn_proxy([engine])
        reply = post_json(p.url, "/v1/chat/completions", {**CHAT, "stream": True})
        assert reply.status == 200
        assert b'"content":"tok"' in reply.body
        assert b'"error"' not in reply.body
        assert reply.body.endswith(b"data: [DONE]\n\n")


# -- Weak: trailers, status 000, close-delimited answers, bare CR ---------------------------------

def test_engine_trailers_do_not_become_response_headers(spawn_proxy: SpawnProxy) -> None:
    body = json.dumps(ANSWER).encode()
    raw = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked"
           b"\r\ntrailer: x-trailer\r\n\r\n%x\r\n%b\r\n0\r\nx-trailer: sneaky\r\n\r\n"
           % (len(body), body))
    with scripted_engine(answering(raw)) as engine:
        p = spawn_proxy([engine])
        reply = post_json(p.url, "/v1/chat/completions", CHAT)
        assert (reply.status, reply.body) == (200, body)
        assert "x-trailer" not in reply.headers


def test_a_status_000_is_a_502_at_once(spawn_proxy: SpawnProxy) -> None:
    with scripted_engine(answering(b"HTTP/1.1 000 Nothing\r\ncontent-length: 0\r\n\r\n")) as engine:
        p = spawn_proxy([engine], "--first-byte-timeout", "600")
        t0 = time.monotonic()
        reply = post_json(p.url, "/v1/chat/completions", CHAT)
        assert reply.status == 502
        assert time.monotonic() - t0 < 10


def test_an_http_1_0_answer_delimited_by_the_close_is_relayed(spawn_proxy: SpawnProxy) -> None:
    body = json.dumps(ANSWER).encode()
    raw = b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n" + body
    with scripted_engine(answering(raw, close=True)) as engine:
        p = spawn_proxy([engine])
        reply = post_json(p.url, "/v1/chat/completions", CHAT)
        assert (reply.status, reply.body) == (200, body)


def test_sse_with_bare_cr_line_ends_keeps_its_tokens(spawn_proxy: SpawnProxy) -> None:
    token = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
             b'"delta":{"content":"tok"},"finish_reason":null}]}\r\r')
    with scripted_engine(answering(sse_chunks([token, b"data: [DONE]\r", b"\r"]))) as engine:
        p = spawn_proxy([engine])
        reply = post_json(p.url, "/v1/chat/completions", {**CHAT, "stream": True})
        assert reply.status == 200
        assert reply.body == token.replace(b"\r", b"\n") + b"data: [DONE]\n\n"
        assert metric(metrics_text(p.url), "toposerve_generation_tokens_total",
                      model="scripted") in (None, 0.0)  # no usage sent: none counted


# -- Weak: SIGTERM past --drain-timeout -----------------------------------------------------------

def test_sigterm_past_the_drain_timeout_ends_streams_with_an_error_event(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--drain-timeout", "1")
    ask = {"model": "sim-model", "prompt": "a", "max_tokens": 50_000, "ignore_eos": True,
           "stream": True}
    with connect(p.url, timeout=30) as sock:
        sock.sendall(request_bytes("POST", "/v1/completions", {"content-type": "application/json"},
                                   json.dumps(ask).encode()))
        got = sock.recv(65536)
        assert got.startswith(b"HTTP/1.1 200")
        os.kill(p.pid, signal.SIGTERM)
        while chunk := sock.recv(65536):
            got += chunk
    assert b'data: {"error"' in got
    assert got.endswith(b"0\r\n\r\n")  # the chunked answer is ended, not cut
    assert wait_for(lambda: " 503 " in p.log(), timeout=10), p.log()[-2000:]


def test_large_answers_to_clients_that_do_not_read_hold_little_memory_and_no_loop(
        spawn_proxy: SpawnProxy) -> None:
    # 16 MB of small objects: buffered and parsed whole (twice) before, that held the event
    # loop for seconds per answer and memory per client; now relayed with back-pressure.
    big = json.dumps({**ANSWER, "filler": [{}] * (4 << 20)}).encode()
    with scripted_engine(answering(json_answer(big))) as engine:
        p = spawn_proxy([engine], "--client-stall-timeout", "120")
        before = rss_bytes(p.pid)
        socks = []
        try:
            for _ in range(10):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
                host, port = p.url.removeprefix("http://").split(":")
                sock.connect((host, int(port)))
                sock.sendall(request_bytes("POST", "/v1/chat/completions",
                                           {"content-type": "application/json"},
                                           json.dumps(CHAT).encode()))
                socks.append(sock)
            slowest, t_end = 0.0, time.monotonic() + 6
            while time.monotonic() < t_end:  # the answers are under way, no client reads
                t0 = time.monotonic()
                assert exchange(p.url, "GET", "/health", timeout=30).status == 200
                slowest = max(slowest, time.monotonic() - t0)
                time.sleep(0.1)
            grown = rss_bytes(p.pid) - before
        finally:
            for sock in socks:
                sock.close()
        assert grown < 100 << 20, f"RSS grew {grown >> 20} MiB"
        # generous for a loaded machine; parsing one such answer on the loop took seconds
        assert slowest < 3.0, f"/health took {slowest:.2f} s"
