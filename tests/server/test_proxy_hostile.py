"""Issue 17's broken items, tried as an attacker and a broken engine would, on loopback: raw
sockets against a real proxy process. Upgrades are refused and their connections closed; request
heads are bounded (431) before the parser buffers them; a POST reaches the engine once, however
many stale pooled connections there are; a huge body of small messages does not hold /health;
a scrape never waits for NVML."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.server.conftest import ProxyProc, SpawnProxy
from tests.server.hostile import (
    Reply,
    connect,
    exchange,
    holds_connection,
    metrics_text,
    open_descriptors,
    post_json,
    read_reply,
    request_bytes,
    rss_bytes,
    stand_in_engine,
    wait_for,
)

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
CHAT_BODY = json.dumps(CHAT).encode()

# -- 1. upgrades ---------------------------------------------------------------------------------

UPGRADES = {
    "websocket with a body": ({"connection": "Upgrade", "upgrade": "websocket"}, b"x" * 100),
    "websocket": ({"connection": "keep-alive, Upgrade", "upgrade": "websocket"}, b""),
    "h2c": ({"connection": "Upgrade, HTTP2-Settings", "upgrade": "h2c"}, b""),
    "Upgrade alone": ({"upgrade": "websocket"}, b""),
    "Connection: upgrade alone": ({"connection": "upgrade"}, b"abc"),
}


def _upgrade_request(path: str, headers: dict[str, str], body: bytes) -> bytes:
    return request_bytes("POST" if body else "GET", path, headers, body, close=False)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/health"])
@pytest.mark.parametrize("kind", list(UPGRADES))
def test_upgrade_is_refused_and_its_connection_closed(proxy: ProxyProc, path: str,
                                                      kind: str) -> None:
    headers, body = UPGRADES[kind]
    with connect(proxy.url) as sock:
        sock.sendall(_upgrade_request(path, headers, body))
        reply = read_reply(sock)
        assert reply.status == 400
        error = reply.json()["error"]
        assert error["code"] == "upgrade_refused"
        assert "Upgrade" in error["message"]
        assert reply.closed
        assert wait_for(lambda: not holds_connection(proxy.pid, sock))


def test_upgrade_after_a_served_request_is_refused_too(proxy: ProxyProc) -> None:
    # The first request hands the connection to uvicorn's protocol: the same rule holds there.
    with connect(proxy.url) as sock:
        sock.sendall(request_bytes("GET", "/health", close=False))
        assert read_reply(sock, see_close=False).status == 200
        sock.sendall(_upgrade_request("/v1/models", *UPGRADES["websocket with a body"]))
        reply = read_reply(sock)
        assert reply.status == 400
        assert reply.closed
        assert wait_for(lambda: not holds_connection(proxy.pid, sock))


def test_connect_method_is_refused(proxy: ProxyProc) -> None:
    with connect(proxy.url) as sock:
        sock.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n")
        reply = read_reply(sock)
        assert reply.status == 400
        assert reply.closed


def test_many_upgrade_requests_hold_no_descriptors(proxy: ProxyProc) -> None:
    before = open_descriptors(proxy.pid)
    socks = [connect(proxy.url) for _ in range(200)]
    try:
        for sock in socks:
            sock.sendall(_upgrade_request("/v1/models", *UPGRADES["websocket with a body"]))
        # The client keeps every socket open and reads nothing: the proxy lets go regardless.
        assert wait_for(lambda: open_descriptors(proxy.pid) <= before + 5, timeout=20)
        assert exchange(proxy.url, "GET", "/health").status == 200
    finally:
        for sock in socks:
            sock.close()


# -- 2. bounded request heads ------------------------------------------------------------------

def _head_with(line_bytes: int, lines: int = 1, path: str = "/v1/chat/completions") -> bytes:
    extra = "".join(f"x-big-{i}: {'a' * line_bytes}\r\n" for i in range(lines))
    return (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{extra}content-type: application/json\r\n"
            f"content-length: {len(CHAT_BODY)}\r\n\r\n").encode() + CHAT_BODY


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_a_header_line_over_the_limit_is_431(proxy: ProxyProc, path: str) -> None:
    with connect(proxy.url) as sock:
        sock.sendall(_head_with(17 * 1024, path=path))
        reply = read_reply(sock)
    assert reply.status == 431
    assert "--max-header-line-bytes" in reply.json()["error"]["message"]
    assert reply.closed


@pytest.mark.parametrize("lines", [1, 70], ids=["one long line", "70 KB in all"])
def test_heads_over_the_limits_after_a_served_request_are_431(proxy: ProxyProc,
                                                              lines: int) -> None:
    # By then the connection is uvicorn's protocol's (server.serve): the same limits hold.
    with connect(proxy.url) as sock:
        sock.sendall(request_bytes("GET", "/health", close=False))
        assert read_reply(sock, see_close=False).status == 200
        sock.sendall(_head_with(17 * 1024 if lines == 1 else 1000, lines=lines))
        reply = read_reply(sock)
    assert reply.status == 431
    assert "--max-header-bytes" in reply.json()["error"]["message"]
    assert reply.closed


def test_headers_over_the_total_limit_are_431(proxy: ProxyProc) -> None:
    with connect(proxy.url) as sock:
        sock.sendall(_head_with(1000, lines=70))  # 70 KB of 1 KB lines
        reply = read_reply(sock)
    assert reply.status == 431
    assert "in all" in reply.json()["error"]["message"]


def test_a_long_url_is_431(proxy: ProxyProc) -> None:
    reply = exchange(proxy.url, "GET", "/v1/models?" + "q" * 20_000)
    assert reply.status == 431


def test_headers_under_the_limits_pass(proxy: ProxyProc) -> None:
    with connect(proxy.url) as sock:
        sock.sendall(_head_with(12 * 1024, lines=4))
        assert read_reply(sock).status == 200


def test_header_limits_are_configurable(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--max-header-line-bytes", "1024", "--max-header-bytes", "4096")
    for head, status in [(_head_with(900, 3), 200), (_head_with(2000), 431),
                         (_head_with(900, 6), 431)]:
        with connect(p.url) as sock:
            sock.sendall(head)
            assert read_reply(sock).status == status


@pytest.mark.parametrize("after_a_request", [False, True], ids=["first", "after-a-request"])
def test_an_endless_header_line_is_cut_off(proxy: ProxyProc, after_a_request: bool) -> None:
    rss_before = rss_bytes(proxy.pid)
    sent = 0
    with connect(proxy.url) as sock:
        if after_a_request:  # the connection is uvicorn's protocol's by then
            sock.sendall(request_bytes("GET", "/health", close=False))
            assert read_reply(sock, see_close=False).status == 200
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\nx-endless: ")
        chunk = b"a" * 65536
        try:
            while sent < 64 * 1024 * 1024:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # the proxy closed: what was sent up to then is all it took
        # It stopped reading long before 64 MiB: at its 64 KiB limit plus what the kernel
        # buffers of the write side and of the reads dropped after the 431.
        assert sent < 32 * 1024 * 1024
    assert rss_bytes(proxy.pid) < rss_before + 32 * 1024 * 1024
    assert exchange(proxy.url, "GET", "/health").status == 200


# -- 3. a POST reaches the engine once ----------------------------------------------------------

def _pool_connections(url: str, n: int) -> None:
    """``n`` concurrent GET /v1/models: the proxy keeps ``n`` idle connections to the engine."""
    threads = [threading.Thread(target=exchange, args=(url, "GET", "/v1/models"))
               for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_a_post_the_engine_closed_on_is_not_replayed(spawn_proxy: SpawnProxy) -> None:
    with stand_in_engine(models_delay=0.3) as engine:
        p = spawn_proxy([engine.url], "--health-interval", "60")
        _pool_connections(p.url, 6)
        assert engine.count("GET /v1/models") >= 6  # (the proxy reads it for model names too)
        reply = post_json(p.url, "/v1/chat/completions", CHAT)
        assert reply.status == 503  # the engine closed without answering: the client retries
        assert "error" in reply.json()
        time.sleep(0.5)  # anything the proxy would still send has arrived by then
        assert engine.count("POST /v1/chat/completions") == 1
        # and on a fresh connection too (nothing pooled now)
        post_json(p.url, "/v1/completions", {"prompt": "x"})
        time.sleep(0.5)
        assert engine.count("POST /v1/completions") == 1


def test_a_get_on_a_stale_connection_is_sent_again_once(spawn_proxy: SpawnProxy) -> None:
    with stand_in_engine(models_delay=0.3) as engine:
        p = spawn_proxy([engine.url], "--health-interval", "60")
        _pool_connections(p.url, 6)
        engine.close_models = True
        before = engine.count("GET /v1/models")
        reply = exchange(p.url, "GET", "/v1/models")
        assert reply.status == 503
        time.sleep(0.5)
        assert engine.count("GET /v1/models") == before + 2  # the request, and one retry


def test_an_idle_connection_near_the_engines_keep_alive_limit_is_not_reused(
        spawn_proxy: SpawnProxy) -> None:
    # vLLM's uvicorn closes idle connections after 5 s; one idle for over 4 s is not written
    # to (a request crossing that close could be lost), a younger one is.
    with stand_in_engine() as engine:
        p = spawn_proxy([engine.url], "--health-interval", "60")
        assert exchange(p.url, "GET", "/ready").status == 200
        assert exchange(p.url, "GET", "/v1/models").status == 200
        before = engine.connections
        assert exchange(p.url, "GET", "/v1/models").status == 200
        assert engine.connections == before  # reused
        time.sleep(4.5)
        assert exchange(p.url, "GET", "/v1/models").status == 200
        assert engine.connections == before + 1  # a new one


# -- 4. a huge body of small messages does not hold the event loop ---------------------------------

def _health_answers_while(p: ProxyProc, body: bytes) -> tuple[int, int, bytes]:
    """Sends ``body`` as a chat request; meanwhile /health is asked again and again on another
    connection. Returns the /health answers received after the whole body was sent and before
    its answer came, the big request's status and its body."""
    sent, done = threading.Event(), threading.Event()
    result: dict[str, object] = {}

    def big() -> None:
        with connect(p.url, timeout=120) as sock:
            sock.sendall(request_bytes("POST", "/v1/chat/completions",
                                       {"content-type": "application/json"}, body))
            sent.set()
            reply = read_reply(sock, timeout=120)
            result["reply"] = reply
            done.set()

    thread = threading.Thread(target=big)
    thread.start()
    answered = 0
    with connect(p.url) as health:
        while not done.is_set():
            health.sendall(request_bytes("GET", "/health", close=False))
            reply = read_reply(health, timeout=120, see_close=False)
            assert reply.status == 200
            if sent.is_set() and not done.is_set():
                answered += 1
    thread.join()
    reply = result["reply"]
    assert isinstance(reply, Reply)
    return answered, reply.status, reply.body


def _many_messages(n: int) -> bytes:
    # Empty contents: no prompt tokens at the simulated engine, which then answers 200.
    return json.dumps({"messages": [{"role": "user", "content": ""}] * n,
                       "max_tokens": 1}).encode()


def test_health_answers_while_a_huge_body_is_validated(spawn_proxy: SpawnProxy,
                                                       sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--max-messages", "1000000", "--max-json-fields", "10000000",
                    "--first-byte-timeout", "120")
    body = _many_messages(240_000)
    assert 7_500_000 < len(body) < 8 * 1024 * 1024  # under --max-body-bytes
    answered, status, text = _health_answers_while(p, body)
    assert status == 200, text[:300]  # validated in full, relayed, answered by the engine
    assert answered >= 10


def test_health_answers_while_a_body_over_the_limits_is_refused(proxy: ProxyProc) -> None:
    answered, status, text = _health_answers_while(proxy, _many_messages(240_000))
    assert status == 400, text[:300]
    assert "--max-json-fields" in json.loads(text)["error"]["message"]
    assert answered >= 10


def test_body_limits_are_a_400_saying_what_to_do(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--max-messages", "100", "--max-json-fields", "5000")
    reply = post_json(p.url, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "x"}] * 101})
    error = reply.json()["error"]
    assert reply.status == 400
    assert "--max-messages" in error["message"]
    assert error["param"] == "messages"
    big_fields = {"messages": [{"role": "user", "content": "x"}],
                  "extra": [{"k": "v" * 20} for _ in range(6000)]}  # over 64 KiB: counted
    reply = post_json(p.url, "/v1/chat/completions", big_fields)
    assert reply.status == 400
    assert "--max-json-fields" in reply.json()["error"]["message"]
    # a large body whose messages are checked a slice at a time still names the bad one
    msgs = [{"role": "user", "content": "y" * 100}] * 90 + [{"content": "no role"}]
    reply = post_json(p.url, "/v1/chat/completions", {"messages": msgs})
    assert reply.status == 400
    assert reply.json()["error"]["param"] == "messages.90.role"
    assert post_json(p.url, "/v1/chat/completions", {"messages": msgs[:90],
                                                     "max_tokens": 1}).status == 200


# -- 5. a scrape never waits for NVML ------------------------------------------------------------

NVML_SHIM = Path(__file__).parent / "nvml_gate"


def test_a_scrape_does_not_wait_for_a_slow_nvml(spawn_proxy: SpawnProxy, sim_url: str,
                                                tmp_path: Path) -> None:
    gate = tmp_path / "nvml-open"
    env = {"PYTHONPATH": str(NVML_SHIM), "TOPOSERVE_TEST_NVML_GATE": str(gate)}
    p = spawn_proxy([sim_url], "--gpu-interval", "0.2", env=env)
    # NVML (the stand-in) blocks in its PCIe reads until the gate opens: a scrape that
    # called it would never return.
    for _ in range(3):
        reply = exchange(p.url, "GET", "/metrics", timeout=10)
        assert reply.status == 200
        assert b"toposerve_requests_queued" in reply.body
    assert post_json(p.url, "/v1/chat/completions", CHAT).status == 200
    gate.touch()
    assert wait_for(lambda: "toposerve_gpu_utilization_ratio" in metrics_text(p.url))
    text = metrics_text(p.url)
    assert 'toposerve_gpu_pcie_tx_bytes_per_second{gpu="0",name="NVIDIA H200"}' in text


def test_socket_module_is_what_the_helpers_use() -> None:
    # Guards the helpers themselves: the descriptor check sees a connection it holds.
    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as client:
        conn, _ = server.accept()
        import os
        assert holds_connection(os.getpid(), client)
        conn.close()
        assert not holds_connection(os.getpid(), client)


@pytest.mark.parametrize("depth", [5_000, 200_000], ids=["inline", "in the thread"])
def test_deep_nesting_is_a_400_saying_what_to_do(proxy: ProxyProc, depth: int) -> None:
    body = b'{"messages": [{"role": "user", "content": "x"}], "x": ' + (
        b"[" * depth + b"]" * depth + b"}")
    reply = exchange(proxy.url, "POST", "/v1/chat/completions",
                     {"content-type": "application/json"}, body)
    assert reply.status == 400
    assert "flatter" in reply.json()["error"]["message"]


# -- engines whose SSE ends lines with CRLF ------------------------------------------------------

def test_an_engine_writing_crlf_sse_streams_through_whole_and_counted(
        spawn_proxy: SpawnProxy) -> None:
    # sse-starlette's separator (llama-cpp-python's server, text-generation-webui); before,
    # no event boundary was ever found and every stream ended as malformed
    chunk = ('data: {"id":"c","object":"chat.completion.chunk","model":"stand-in","choices":'
             '[{"index":0,"delta":{"content":"%s"},"finish_reason":%s}]}\r\n\r\n')
    events = [(chunk % (t, "null")).encode() for t in ("a", "b")]
    events.append((chunk % ("c", '"stop"')).encode())
    events.append(b'data: {"id":"c","object":"chat.completion.chunk","choices":[],'
                  b'"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}\r\n\r\n')
    events.append(b"data: [DONE]\r\n\r\n")
    with stand_in_engine(stream=events) as engine:
        p = spawn_proxy([engine.url], "--health-interval", "60")
        reply = post_json(p.url, "/v1/chat/completions", {
            "model": "stand-in", "stream": True, "messages": [{"role": "user", "content": "x"}]})
        assert reply.status == 200
        body = reply.body.decode()
        got = [e for e in body.split("\n\n") if e.strip()]
        assert got[-1] == "data: [DONE]"
        contents = [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in got[:-1]]
        assert contents == ["a", "b", "c"]  # the usage chunk the proxy asked for is not passed on
        text = metrics_text(p.url)
        assert 'toposerve_generation_tokens_total{model="stand-in"} 3.0' in text
        assert 'kind="malformed"' not in text  # the stream was whole
        assert 'kind="stream_broken"' not in text


def test_an_engine_that_requires_its_own_key_gets_it_and_never_the_clients(
        spawn_proxy: SpawnProxy) -> None:
    events = [b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}'
              b"\n\n", b"data: [DONE]\n\n"]
    with stand_in_engine(stream=events, require_key="engine-secret") as engine:
        p = spawn_proxy([engine.url], "--health-interval", "60", "--api-key", "client-key",
                        env={"TOPOSERVE_UPSTREAM_API_KEY": "engine-secret"})
        reply = post_json(p.url, "/v1/chat/completions", {
            "model": "stand-in", "stream": True, "messages": [{"role": "user", "content": "x"}]},
            {"authorization": "Bearer client-key"})
        assert reply.status == 200, reply.body
        assert b'"content":"a"' in reply.body
        # every request it saw (health, model list, the chat) carried the engine's key
        assert set(engine.authorizations) == {"Bearer engine-secret"}
        assert engine.count("GET /v1/models") >= 1
