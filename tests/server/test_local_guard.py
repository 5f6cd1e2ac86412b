"""Local-serving protections (server.guard, server.conncap), each attacked over raw sockets on a
real proxy in front of the simulated engine: cross-site and DNS-rebinding requests, duplicate
credentials, credentials in --upstream, media URLs pointing inside, and connection floods."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from simengine.engine import stop_process
from tests.server.conftest import (
    REPO,
    ProxyProc,
    SpawnProxy,
    free_port,
    run_proxy,
    sim_stats,
    wait_for,
)
from tests.server.hostile import connect, read_reply

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MESSAGES = {"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def raw(url: str, method: str, path: str, headers: list[tuple[str, str]],
        body: bytes = b"") -> tuple[int, dict[str, str], Any]:
    """One request with exactly these header lines (no Host unless given), over a socket."""
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers),
             f"content-length: {len(body)}", "connection: close"]
    with connect(url) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        reply = read_reply(sock, see_close=False)
    try:
        parsed = json.loads(reply.body) if reply.body else None
    except ValueError:
        parsed = reply.body
    return reply.status, reply.headers, parsed


def port_of(proxy: ProxyProc) -> int:
    return int(proxy.url.rsplit(":", 1)[1])


def generations(sim_url: str) -> int:
    stats = sim_stats(sim_url)["by_route"]
    return sum(stats.get(r, 0) for r in ("/v1/chat/completions", "/v1/completions",
                                         "/v1/messages", "/v1/responses"))


# -- 1. cross-site requests and DNS rebinding ------------------------------------------------

ATTACKS = [  # (Host, Origin): what a web page can make a browser send
    ("attacker.example", "http://attacker.example"),  # rebinding, and cross-site
    ("attacker.example:{port}", None),  # rebinding: same-origin for the browser, no Origin
    ("127.0.0.1:{port}", "http://attacker.example"),  # plain CSRF
    ("localhost:{port}", "null"),  # a sandboxed frame
    (":{port}", None),  # an empty host (Ollama's bypass)
    ("127.0.0.1.attacker.example", None),
    ("localhost.attacker.example:{port}", "https://localhost.attacker.example"),
]


@pytest.mark.parametrize(("host", "origin"), ATTACKS)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
def test_a_cross_site_text_plain_post_is_refused_by_a_keyless_loopback_proxy(
        proxy: ProxyProc, sim_url: str, host: str, origin: str | None, path: str) -> None:
    headers = [("host", host.format(port=port_of(proxy))), ("content-type", "text/plain")]
    if origin is not None:
        headers.append(("origin", origin))
    body = {**CHAT, "prompt": "hi", "input": "hi"}
    status, _, answer = raw(proxy.url, "POST", path, headers, json.dumps(body).encode())
    assert status == 403
    assert answer["error"]["type"] == "permission_error"
    assert answer["error"]["code"] in ("host_not_allowed", "cross_site_request")
    assert "--allowed-" in answer["error"]["message"]
    assert generations(sim_url) == 0


def test_a_rebinding_page_reads_nothing(proxy: ProxyProc, sim_url: str) -> None:
    host = f"rebound.attacker.example:{port_of(proxy)}"
    for path in ("/v1/models", "/ready", "/metrics", "/health", "/openapi.json"):
        status, _, answer = raw(proxy.url, "GET", path, [("host", host)])
        assert status == 403, path
        assert answer["error"]["code"] == "host_not_allowed"


def test_a_cross_site_request_on_the_anthropic_route_gets_an_anthropic_error(
        proxy: ProxyProc, sim_url: str) -> None:
    status, _, answer = raw(proxy.url, "POST", "/v1/messages",
                            [("host", f"127.0.0.1:{port_of(proxy)}"),
                             ("origin", "https://attacker.example"),
                             ("content-type", "text/plain")], json.dumps(MESSAGES).encode())
    assert status == 403
    assert answer["type"] == "error"
    assert answer["error"]["type"] == "permission_error"
    assert generations(sim_url) == 0


LOCAL = [  # what local clients send: all served
    ("127.0.0.1:{port}", None), ("localhost:{port}", None), ("LOCALHOST.:{port}", None),
    ("[::1]:{port}", None), ("127.0.0.2", None), ("app.localhost:{port}", None),
    ("localhost:{port}", "http://localhost:{port}"), ("127.0.0.1:{port}", "http://localhost:3000"),
    ("127.0.0.1:{port}", "http://[::1]:5173"), ("127.0.0.1:{port}", "vscode-webview://abc123"),
    ("127.0.0.1:{port}", "http://127.0.0.1:{port}"),
]


@pytest.mark.parametrize(("host", "origin"), LOCAL)
def test_local_clients_and_local_pages_are_served(proxy: ProxyProc, sim_url: str, host: str,
                                                  origin: str | None) -> None:
    port = port_of(proxy)
    headers = [("host", host.format(port=port)), ("content-type", "application/json")]
    if origin is not None:
        headers.append(("origin", origin.format(port=port)))
    status, _, answer = raw(proxy.url, "POST", "/v1/chat/completions", headers,
                            json.dumps(CHAT).encode())
    assert status == 200, answer
    assert generations(sim_url) == 1


def test_an_http_1_0_request_without_host_is_no_browser_and_is_served(
        proxy: ProxyProc, sim_url: str) -> None:
    # HTTP/1.1 without Host is a 400 (RFC 9112 3.2): tests/server/test_host_header.py
    with connect(proxy.url) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.0\r\n\r\n")
        assert read_reply(sock).status == 200


def test_allowed_hosts_and_origins_open_the_names_the_user_gives(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--allowed-hosts", "mybox.lan, 192.168.7.7",
                    "--allowed-origins", "http://ui.lan:3000")
    for host, origin in [("mybox.lan:9", None), ("192.168.7.7", None),
                         ("mybox.lan", "http://UI.lan:3000"), ("127.0.0.1", "http://ui.lan:3000/")]:
        headers = [("host", host)] + ([("origin", origin)] if origin else [])
        assert raw(p.url, "GET", "/v1/models", headers)[0] == 200, (host, origin)
    assert raw(p.url, "GET", "/v1/models", [("host", "other.lan")])[0] == 403
    assert raw(p.url, "GET", "/v1/models", [("host", "mybox.lan"),
                                            ("origin", "http://ui.lan:3001")])[0] == 403


def test_a_keyed_proxy_takes_other_origins_but_still_checks_host(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--api-key", "k1")
    auth = ("authorization", "Bearer k1")
    cross = [("host", "127.0.0.1"), ("origin", "http://attacker.example"), auth]
    assert raw(p.url, "POST", "/v1/chat/completions", cross, json.dumps(CHAT).encode())[0] == 200
    assert raw(p.url, "GET", "/ready", [("host", "attacker.example")])[0] == 403


def test_a_public_bind_checks_origin_and_an_address_passes_the_host_check(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    # Names from this machine: tests/server/test_public_bind_rebinding.py
    p = spawn_proxy([sim_url], "--host", "0.0.0.0")
    assert raw(p.url, "GET", "/v1/models", [("host", "192.0.2.7:8000")])[0] == 200
    status, _, answer = raw(p.url, "GET", "/v1/models", [("host", "192.0.2.7:8000"),
                                                          ("origin", "http://attacker.example")])
    assert status == 403
    assert answer["error"]["code"] == "cross_site_request"
    same = [("host", "192.0.2.7:8000"), ("origin", "http://192.0.2.7:8000")]
    assert raw(p.url, "GET", "/v1/models", same)[0] == 200


# -- 2. what a keyless proxy exposes, said at start ------------------------------------------

def test_a_keyless_proxy_says_at_start_what_it_exposes_and_how_to_add_a_key(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    keyless = spawn_proxy([sim_url])
    lines = [ln for ln in keyless.log().splitlines() if "no API key:" in ln]
    assert len(lines) == 1
    assert "every local user and process" in lines[0]
    assert "--api-key-file" in lines[0]
    keyed = spawn_proxy([sim_url], "--api-key", "k1")
    assert "no API key" not in keyed.log()


# -- 3. duplicate credentials ------------------------------------------------------------------

DUPLICATES = [
    [("authorization", "Bearer k1"), ("authorization", "Bearer wrong")],
    [("authorization", "Bearer wrong"), ("authorization", "Bearer k1")],
    [("x-api-key", "k1"), ("x-api-key", "wrong")],
    [("x-api-key", "wrong"), ("x-api-key", "k1")],
    [("host", "127.0.0.1"), ("authorization", "Bearer k1")],  # a second Host
]


@pytest.fixture(scope="module")
def keyed(_shared_sim: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    with run_proxy([_shared_sim], "--api-key", "k1",
                   log_dir=tmp_path_factory.mktemp("keyed")) as proxy:
        yield proxy


@pytest.mark.parametrize("dup", DUPLICATES)
@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models"),
    ("POST", "/v1/messages"), ("POST", "/v1/responses")])
def test_duplicate_credentials_are_400_on_every_route(
        keyed: ProxyProc, sim_url: str, dup: list[tuple[str, str]], method: str,
        path: str) -> None:
    p = keyed
    body = json.dumps({**CHAT, "prompt": "hi", "input": "hi"}).encode() if method == "POST" else b""
    status, _, answer = raw(p.url, method, path, [("host", "127.0.0.1"), *dup,
                                                  ("content-type", "application/json")], body)
    assert status == 400
    error = answer["error"]
    assert (error.get("code") == "duplicate_header" or
            (answer.get("type") == "error" and error["type"] == "invalid_request_error"))
    assert "more than one" in error["message"]
    assert generations(sim_url) == 0


# -- 4. credentials in --upstream ----------------------------------------------------------------

@pytest.mark.parametrize("upstream", [
    "http://user:s3cret-pw@127.0.0.1:8001", "http://user:s3cret-pw@127.0.0.1:8001/v1",
    "https://user:s3cret-pw@127.0.0.1:8001", "http://:s3cret-pw@127.0.0.1:8001",
    "http://s3cret-pw@127.0.0.1:8001/path"])
def test_credentials_in_upstream_stop_the_proxy_with_one_line_naming_the_key_option(
        upstream: str) -> None:
    done = subprocess.run([sys.executable, "-m", "server", "--upstream", upstream, "--port", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "s3cret" not in done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "--upstream-api-key" in lines[0]
    assert "***@" in lines[0]


# -- 5. media URLs pointing inside ---------------------------------------------------------------

INSIDE = ["http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:22/", "http://[::1]/",
          "http://10.1.2.3/x.png", "http://0x7f.1/", "http://2130706433/", "file:///etc/passwd",
          "http://[::ffff:169.254.169.254]/", "http://metadata.google.internal/",
          "http://localhost:8000/v1/models", "gopher://127.0.0.1:6379/"]


def chat_with_image(url: str) -> dict[str, Any]:
    return {"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": url}}]}]}


@pytest.mark.parametrize("url", INSIDE)
def test_a_media_url_pointing_inside_is_refused(proxy: ProxyProc, sim_url: str, url: str) -> None:
    status, _, answer = raw(proxy.url, "POST", "/v1/chat/completions",
                            [("host", "127.0.0.1"), ("content-type", "application/json")],
                            json.dumps(chat_with_image(url)).encode())
    assert status == 400
    assert answer["error"]["code"] == "internal_media_url"
    assert "--allow-internal-media" in answer["error"]["message"]
    assert generations(sim_url) == 0


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/messages", {**MESSAGES, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://192.168.0.1/"}}]}]}),
    ("/v1/responses", {"model": "sim-model", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://169.254.169.254/"}]}]}),
    ("/v1/chat/completions", {**chat_with_image("x"), "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_\\u0075rl": {"url": "http://127.0.0.1/"}}]}]}),
])
def test_media_urls_pointing_inside_are_refused_on_every_route(
        proxy: ProxyProc, sim_url: str, path: str, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode().replace(b"\\\\u0075", b"\\u0075")  # a key spelled escaped
    status, _, answer = raw(proxy.url, "POST", path, [("host", "127.0.0.1"),
                                                      ("content-type", "application/json")], data)
    assert status == 400, answer
    assert generations(sim_url) == 0


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32-le", "utf-8-sig"])
def test_a_media_url_inside_a_body_in_another_json_encoding_is_refused(
        proxy: ProxyProc, sim_url: str, encoding: str) -> None:
    data = json.dumps(chat_with_image("http://127.0.0.1/")).encode(encoding)
    for path in ("/v1/chat/completions", "/v1/messages"):
        status, _, _ = raw(proxy.url, "POST", path, [("host", "127.0.0.1")], data)
        assert status == 400
    assert generations(sim_url) == 0


def test_public_and_data_media_pass_and_the_option_lets_inside_ones_through(
        spawn_proxy: SpawnProxy, proxy: ProxyProc, sim_url: str) -> None:
    for url in ("https://example.com/cat.png", "data:image/png;base64,iVBORw0KGgo="):
        status, _, _ = raw(proxy.url, "POST", "/v1/chat/completions", [("host", "127.0.0.1")],
                           json.dumps(chat_with_image(url)).encode())
        assert status == 200
    p = spawn_proxy([sim_url], "--allow-internal-media")
    status, _, _ = raw(p.url, "POST", "/v1/chat/completions", [("host", "127.0.0.1")],
                       json.dumps(chat_with_image("http://169.254.169.254/")).encode())
    assert status == 200
    assert generations(sim_url) == 3


# -- 6. the connection cap -----------------------------------------------------------------------

def idle_sockets(url: str, n: int) -> list[socket.socket]:
    return [connect(url, timeout=10) for _ in range(n)]


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(0.01)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_idle_connections_are_closed_to_make_room_for_a_new_client(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--max-connections", "8")
    idle = idle_sockets(p.url, 20)
    try:
        status, _, _ = raw(p.url, "POST", "/v1/chat/completions", [("host", "127.0.0.1")],
                           json.dumps(CHAT).encode())
        assert status == 200
        assert wait_for(lambda: sum(closed_by_peer(s) for s in idle) >= 13, timeout=10)
    finally:
        for s in idle:
            s.close()
    assert wait_for(lambda: counter(p.url, "toposerve_idle_connections_closed_total") >= 13)
    assert counter(p.url, "toposerve_connections_refused_total") == 0


def test_past_the_cap_with_every_connection_busy_a_new_client_gets_503_at_once(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--max-connections", "8", "--header-timeout", "60")
    busy = idle_sockets(p.url, 8)
    try:
        for s in busy:  # each is inside a request head: not idle, never closed to make room
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        time.sleep(0.5)
        started = time.monotonic()
        with connect(p.url) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            reply = read_reply(sock, timeout=10)
        assert time.monotonic() - started < 5  # not left to wait for a slot (generous bound)
        assert reply.status == 503
        assert reply.closed
        assert reply.headers["retry-after"] == "1"
        assert reply.json()["error"]["code"] == "too_many_connections"
        assert not any(closed_by_peer(s) for s in busy)
    finally:
        for s in busy:
            s.close()
    # the busy ones gone, the proxy serves again, and says how many it refused
    assert wait_for(lambda: raw(p.url, "GET", "/health", [("host", "127.0.0.1")])[0] == 200)
    assert counter(p.url, "toposerve_connections_refused_total") >= 1  # retries may add some
    assert counter(p.url, "toposerve_idle_connections_closed_total") == 0


def test_kept_alive_connections_on_uvicorns_routes_are_idle_too(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--max-connections", "4")
    kept = idle_sockets(p.url, 4)
    try:
        for s in [*kept, kept[0]]:  # answered by uvicorn's protocol (not a lean route)
            s.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            assert read_reply(s, see_close=False).status == 200
        status, _, _ = raw(p.url, "GET", "/v1/models", [("host", "127.0.0.1")])
        assert status == 200
        assert wait_for(lambda: sum(closed_by_peer(s) for s in kept) >= 1, timeout=10)
        assert closed_by_peer(kept[1])  # the longest silent first: kept[0] spoke last
        assert not closed_by_peer(kept[0])
    finally:
        for s in kept:
            s.close()


def counter(url: str, name: str) -> float:
    """A sample of the proxy's /metrics, read over a new connection (0 when absent)."""
    status, _, text = raw(url, "GET", "/metrics", [("host", "127.0.0.1")])
    assert status == 200
    assert isinstance(text, bytes)
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _few_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_the_issues_flood_300_idle_connections_with_256_descriptors_locks_no_client_out(
        sim_url: str, tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "proxy.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "--upstream", sim_url, "--port", str(port)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_few_descriptors)
    url = f"http://127.0.0.1:{port}"
    flood: list[socket.socket] = []
    try:
        assert wait_for(lambda: _answers(url), timeout=30), (tmp_path / "proxy.log").read_text()
        flood = idle_sockets(url, 300)  # the kernel takes them all (listen backlog)
        started = time.monotonic()
        status, _, _ = raw(url, "POST", "/v1/chat/completions", [("host", "127.0.0.1")],
                           json.dumps(CHAT).encode())
        assert status == 200
        assert time.monotonic() - started < 10  # not after the 15 s header timeout
    finally:
        for s in flood:
            s.close()
        stop_process(proc, 15)
        log.close()


def _answers(url: str) -> bool:
    try:
        return raw(url, "GET", "/health", [("host", "127.0.0.1")])[0] == 200
    except OSError:
        return False
