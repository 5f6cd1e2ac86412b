"""Issue 17's weak items, each tried on loopback against a real proxy process: a client that
stops reading, /ready under --protect-metrics and during a slow engine /health, vLLM's admin
routes, a huge non-streamed answer, odd paths, empty and non-ASCII keys, model labels, strict
token counts and UTF-16 bodies."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from server.config import ConfigError, config_from_args
from tests.server.conftest import REPO, ProxyProc, SpawnProxy, sim_control, sim_stats
from tests.server.hostile import (
    address,
    connect,
    exchange,
    holds_connection,
    metrics_text,
    post_json,
    read_reply,
    request_bytes,
    wait_for,
)

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def by_route(sim_url: str, route: str) -> int:
    return int(sim_stats(sim_url)["by_route"].get(route, 0))


def metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


# -- a client that stops reading ------------------------------------------------------------------

def test_a_client_that_stops_reading_is_cut_off_and_counted_as_a_stall(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--client-stall-timeout", "1", "--idle-timeout", "6")
    sim_control(sim_url, itl=0.0002)  # a fast stream: it fills every buffer on the way quickly
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 90_000,
                       "stream": True}).encode()
    _stall_and_check(p, sim_url, "/v1/chat/completions", {"content-type": "application/json"},
                     body)


STALL_ROUTES = ["/v1/chat/completions",  # the lean front's downstream
                "/v1/messages"]  # relayed through FastAPI: uvicorn's cycle under the guards


@pytest.mark.parametrize("path", STALL_ROUTES)
def test_a_stalled_client_is_a_stall_even_when_the_idle_timeout_is_shorter(
        spawn_proxy: SpawnProxy, sim_url: str, path: str) -> None:
    # The idle timer runs out first; the engine is fine (the proxy stopped reading it because
    # the client took nothing), so the client is the one blamed, at its own timeout.
    p = spawn_proxy([sim_url], "--client-stall-timeout", "2", "--idle-timeout", "1")
    sim_control(sim_url, itl=0.0002)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 90_000,
                       "stream": True}).encode()
    _stall_and_check(p, sim_url, path, {"content-type": "application/json",
                                        "anthropic-version": "2023-06-01"}, body)


def _stall_and_check(p: ProxyProc, sim_url: str, path: str, headers: dict[str, str],
                     body: bytes) -> None:
    """Send one request and never read: the proxy lets go of the socket, the engine request is
    aborted, and it counts as one client stall (499), not as an engine timeout."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(address(p.url))
    try:
        sock.sendall(request_bytes("POST", path, headers, body))
        assert wait_for(lambda: holds_connection(p.pid, sock), timeout=5)
        assert wait_for(lambda: not holds_connection(p.pid, sock), timeout=20)
        assert wait_for(lambda: sim_stats(sim_url)["aborted"] >= 1)
        text = metrics_text(p.url)
        assert metric(text, "toposerve_client_stalls_total") == 1.0
        assert metric(text, "toposerve_upstream_errors_total", kind="timeout") is None
        assert metric(text, "toposerve_requests_total", status="499") == 1.0
    finally:
        sock.close()


# -- /ready ------------------------------------------------------------------------------------

def test_protect_metrics_closes_ready_too(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--api-key", "k-1", "--protect-metrics")
    reply = exchange(p.url, "GET", "/ready")
    assert reply.status == 401
    assert reply.json()["error"]["type"] == "authentication_error"
    assert exchange(p.url, "GET", "/ready", {"authorization": "Bearer k-1"}).status == 200
    assert exchange(p.url, "GET", "/health").status == 200


def test_concurrent_ready_calls_during_a_slow_engine_health_share_one_probe(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--health-interval", "60")
    assert exchange(p.url, "GET", "/ready").status == 200  # the start-up probe is done
    sim_control(sim_url, health_delay=2.5)  # slower than the 2 s a probe waits
    replies: list[int] = []
    threads = [threading.Thread(target=lambda: replies.append(
        exchange(p.url, "GET", "/ready", timeout=20).status)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # One slow probe is a busy engine, not a dead one: it stays in routing.
    assert replies == [200, 200, 200]
    assert metric(metrics_text(p.url), "toposerve_upstream_up") == 1.0
    assert post_json(p.url, "/v1/chat/completions", CHAT).status == 200


# -- vLLM's admin routes -------------------------------------------------------------------------

ADMIN = ["/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/reset_prefix_cache",
         "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/start_profile", "/stop_profile",
         "/scale_elastic_ep", "/pause", "/resume", "/update_weights",
         "/init_weight_transfer_engine", "/fault_tolerance/apply", "/server_info",
         # other spellings of one route
         "//sleep", "/sleep/", "/%73leep", "/SLEEP", "/v1/../sleep", "/x/./../collective_rpc"]


@pytest.mark.parametrize("path", ADMIN)
def test_admin_routes_are_refused_without_an_admin_key(proxy: ProxyProc, sim_url: str,
                                                       path: str) -> None:
    for method in ("POST", "GET"):
        reply = exchange(proxy.url, method, path, {"content-type": "application/json"},
                         b"{}" if method == "POST" else b"")
        assert reply.status == 403, reply.body
        error = reply.json()["error"]
        assert error["type"] == "permission_error"
        assert "--admin-api-key" in error["message"]
    seen = sim_stats(sim_url)["by_route"]  # the proxy's own /health and /v1/models reads aside
    own = ("/health", "/v1/models", "/sim/")
    assert {k: v for k, v in seen.items() if not k.startswith(own)} == {}


def test_admin_routes_need_the_admin_key_not_a_user_key(spawn_proxy: SpawnProxy,
                                                        sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--api-key", "user-k", "--admin-api-key", "admin-k")
    for headers in ({}, {"authorization": "Bearer user-k"}, {"x-api-key": "user-k"}):
        assert exchange(p.url, "POST", "/sleep", headers, b"{}").status == 403
    assert by_route(sim_url, "/sleep") == 0
    reply = exchange(p.url, "POST", "/sleep", {"authorization": "Bearer admin-k"}, b"{}")
    assert reply.status == 404  # relayed: the simulated engine has no /sleep
    assert by_route(sim_url, "/sleep") == 1
    # user routes still take user keys only
    assert post_json(p.url, "/v1/chat/completions", CHAT,
                     {"authorization": "Bearer user-k"}).status == 200


# -- a huge non-streamed answer --------------------------------------------------------------------

def test_a_non_streamed_answer_over_the_limit_is_502(spawn_proxy: SpawnProxy,
                                                     sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--max-response-bytes", "3000")
    # the size is the point, not the pace: 3000 tokens at the shared sim's 5 ms were 15 s
    sim_control(sim_url, itl=0.0002)
    reply = post_json(p.url, "/v1/completions", {"prompt": "x", "max_tokens": 3000})
    assert reply.status == 502
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "exceeded --max-response-bytes (3000 bytes)" in error["message"]
    assert "larger --max-response-bytes" in error["message"]
    assert "broke off" not in error["message"]
    text = metrics_text(p.url)
    assert metric(text, "toposerve_upstream_errors_total", kind="too_large") == 1.0
    assert metric(text, "toposerve_upstream_errors_total", kind="stream_broken") is None
    assert post_json(p.url, "/v1/completions", {"prompt": "x", "max_tokens": 2}).status == 200
    assert exchange(p.url, "GET", "/v1/models").status == 200


# -- paths -----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/%E2%82%AC", "/v1/%FF%FE", "/caf%C3%A9?q=%E2%82%AC",
                                  "/v1/models%00", "/%F0%9F%94%91/x"])
def test_percent_encoded_non_ascii_paths_get_a_clean_answer(proxy: ProxyProc, path: str) -> None:
    reply = exchange(proxy.url, "GET", path)
    assert reply.status in (400, 404)
    assert b"Internal" not in reply.body
    assert "internal error" not in proxy.log()


def test_raw_non_ascii_path_bytes_are_a_400(proxy: ProxyProc) -> None:
    with connect(proxy.url) as sock:
        sock.sendall(b"GET /caf\xc3\xa9 HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        assert read_reply(sock).status == 400


# -- keys --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "env"), [
    (["--api-key", ""], {}), (["--api-key", "  "], {}), (["--api-key", "k", "--api-key", ""], {}),
    ([], {"TOPOSERVE_API_KEYS": " , "}), (["--admin-api-key", ""], {})])
def test_an_empty_key_is_an_error(argv: list[str], env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="key"):
        config_from_args(["--upstream", "http://127.0.0.1:1", *argv], env=env)


def test_an_empty_key_stops_the_proxy_with_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "server", "--upstream", "http://127.0.0.1:1",
                        "--api-key", ""], capture_output=True, text=True, cwd=REPO, timeout=30,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "--api-key" in lines[0]
    assert "Traceback" not in r.stderr


def test_no_key_at_all_still_runs_open(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], env={"TOPOSERVE_API_KEYS": ""})
    assert post_json(p.url, "/v1/chat/completions", CHAT).status == 200


NON_ASCII_KEY = "clé-ключ-🔑"


def _with_key(key: bytes, method: str, path: str, body: bytes = b"") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n").encode() + (
        b"authorization: Bearer " + key + b"\r\n\r\n" + body)


def test_a_non_ascii_key_matches(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], env={"TOPOSERVE_API_KEYS": NON_ASCII_KEY})
    body = json.dumps(CHAT).encode()
    for key, status in [(NON_ASCII_KEY.encode(), 200), (NON_ASCII_KEY.encode()[:-1], 401),
                        (NON_ASCII_KEY.upper().encode(), 401), (b"cl\xe9", 401)]:
        for method, path, payload in [("POST", "/v1/chat/completions", body),
                                      ("GET", "/v1/models", b"")]:
            with connect(p.url) as sock:
                sock.sendall(_with_key(key, method, path, payload))
                assert read_reply(sock).status == status, (key, path)


# -- model labels ------------------------------------------------------------------------------

def test_model_names_the_engine_rejects_take_no_label(spawn_proxy: SpawnProxy,
                                                      sim_url: str) -> None:
    p = spawn_proxy([sim_url])
    assert exchange(p.url, "GET", "/ready").status == 200  # the engine's model names are read
    for i in range(40):
        reply = post_json(p.url, "/v1/chat/completions", CHAT | {"model": f"nope-{i}"})
        assert reply.status == 404  # the engine does not serve it
    assert post_json(p.url, "/v1/chat/completions", CHAT | {"model": "sim-model"}).status == 200
    text = metrics_text(p.url)
    assert "nope-" not in text
    assert metric(text, "toposerve_requests_total", model="sim-model", status="200") == 1.0
    assert metric(text, "toposerve_requests_total", model="other", status="404") == 40.0


# -- strict token counts -------------------------------------------------------------------------

@pytest.mark.parametrize(("field", "value"), [
    ("max_tokens", "5"), ("max_tokens", True), ("max_tokens", 5.0), ("max_tokens", -1),
    ("max_completion_tokens", "5"), ("max_completion_tokens", False)])
def test_token_counts_must_be_integers(proxy: ProxyProc, sim_url: str, field: str,
                                       value: object) -> None:
    reply = post_json(proxy.url, "/v1/chat/completions",
                      {"messages": CHAT["messages"], field: value})
    assert reply.status == 400
    assert reply.json()["error"]["param"] == field
    assert by_route(sim_url, "/v1/chat/completions") == 0  # refused by the proxy itself
    assert post_json(proxy.url, "/v1/chat/completions",
                     {"messages": CHAT["messages"], field: 2}).status == 200


def test_completions_token_counts_too(proxy: ProxyProc, sim_url: str) -> None:
    reply = post_json(proxy.url, "/v1/completions", {"prompt": "x", "max_tokens": "2"})
    assert reply.status == 400
    assert by_route(sim_url, "/v1/completions") == 0
    assert post_json(proxy.url, "/v1/completions", {"prompt": "x", "max_tokens": 2}).status == 200


# -- bodies not in UTF-8 --------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be",
                                      "utf-16", "utf-8-sig"])
def test_a_streamed_request_in_utf16_or_utf32_is_relayed_intact(proxy: ProxyProc,
                                                                encoding: str) -> None:
    obj = {"messages": [{"role": "user", "content": "héllo ✓"}], "max_tokens": 3,
           "stream": True}
    reply = exchange(proxy.url, "POST", "/v1/chat/completions",
                     {"content-type": "application/json"}, json.dumps(obj).encode(encoding))
    assert reply.status == 200, reply.body[:300]
    events = [e for e in reply.body.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert all(c["choices"] for c in chunks)  # the usage chunk the proxy asked for is dropped
    assert sum(1 for c in chunks if c["choices"][0]["delta"].get("content")) == 3


def test_helpers_see_metrics(proxy: ProxyProc) -> None:
    # The metric() reader itself: a series that exists is found, one that does not is None.
    text = metrics_text(proxy.url)
    assert metric(text, "toposerve_requests_queued") == 0.0
    assert metric(text, "toposerve_no_such_metric") is None
    assert re.search(r"toposerve_upstream_up\{", text)
    time.sleep(0)
