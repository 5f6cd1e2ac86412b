"""Keys, bad input, limits and slow clients: OpenAI-format errors, never a 5xx for bad input,
and the key never in logs, metrics or error messages."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server.config import ConfigError, ProxyConfig, config_from_args, load_keys
from server.serve import security_warnings
from tests.server.conftest import (
    REPO,
    ProxyProc,
    SpawnProxy,
    run_proxy,
    sim_control,
    sim_stats,
    wait_for,
)

KEY = "sk-toposerve-SECRET-7f3a9c"
WRONG = "sk-wrong-MARKER-55e1"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def assert_openai_error(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    error: dict[str, object] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.fixture(scope="module")
def _keyed(_shared_sim: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    """One keyed proxy for the module's key tests (a proxy start is ~1 s): its log and metrics,
    which must never show the key, then hold every key test's traffic."""
    with run_proxy([_shared_sim], env={"TOPOSERVE_API_KEYS": f"other-key,{KEY}"},
                   log_dir=tmp_path_factory.mktemp("keyed")) as proxy:
        yield proxy


@pytest.fixture
def keyed(_keyed: ProxyProc, sim_url: str) -> ProxyProc:
    """The keyed proxy in front of the shared sim, reset for each test as `sim_url` is."""
    return _keyed


@pytest.mark.parametrize("headers", [
    {}, {"authorization": f"Bearer {WRONG}"}, {"authorization": WRONG}, {"x-api-key": WRONG},
    {"authorization": f"Bearer {KEY}x"}])
def test_missing_or_wrong_key_is_401(keyed: ProxyProc, headers: dict[str, str]) -> None:
    for path in ("/v1/chat/completions", "/tokenize"):
        r = httpx.post(keyed.url + path, json=CHAT, headers=headers)
        error = assert_openai_error(r, 401)
        assert error["type"] == "authentication_error"
    assert_openai_error(httpx.get(keyed.url + "/v1/models", headers=headers), 401)


@pytest.mark.parametrize("headers", [{"authorization": f"Bearer {KEY}"}, {"x-api-key": KEY},
                                     {"authorization": "Bearer other-key"}])
def test_right_key_passes(keyed: ProxyProc, headers: dict[str, str]) -> None:
    assert httpx.post(keyed.url + "/v1/chat/completions", json=CHAT,
                      headers=headers).status_code == 200


def test_health_ready_and_metrics_stay_open(keyed: ProxyProc) -> None:
    for path in ("/health", "/ready", "/metrics", "/openapi.json"):
        assert httpx.get(keyed.url + path).status_code == 200


def test_protect_metrics_closes_metrics(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--api-key", KEY, "--protect-metrics")
    assert_openai_error(httpx.get(p.url + "/metrics"), 401)
    assert httpx.get(p.url + "/metrics", headers={"x-api-key": KEY}).status_code == 200
    assert httpx.get(p.url + "/health").status_code == 200


def test_key_never_in_logs_metrics_or_errors(keyed: ProxyProc) -> None:
    bodies = []
    for headers in ({"authorization": f"Bearer {WRONG}"}, {"authorization": f"Bearer {KEY}"}):
        for body in (CHAT, CHAT | {"stream": True}, {"messages": "bad"}):
            r = httpx.post(keyed.url + "/v1/chat/completions?key=" + KEY, json=body,
                           headers=headers | {"x-request-id": "rid-1"})
            bodies.append(r.text + json.dumps(dict(r.headers)))
    metrics = httpx.get(keyed.url + "/metrics").text
    log = keyed.log()
    assert "rid-1" in log  # the access log is on, and still holds no key
    for secret in (KEY, WRONG, "SECRET", "MARKER"):
        assert secret not in log
        assert secret not in metrics
        assert all(secret not in b for b in bodies)


def test_key_file_must_be_private(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# team keys\n{KEY}\n\n  # laptop\nsecond\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_keys([], str(path), {})
    path.chmod(0o600)
    assert load_keys([], str(path), {}) == (KEY, "second")
    assert load_keys(["a"], str(path), {"TOPOSERVE_API_KEYS": "b, a"}) == ("a", KEY, "second", "b")


def test_public_key_file_stops_the_proxy_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(KEY)
    path.chmod(0o644)
    r = subprocess.run([sys.executable, "-m", "server", "--upstream", "http://127.0.0.1:1",
                        "--api-key-file", str(path)], capture_output=True, text=True, cwd=REPO,
                       timeout=30)
    assert r.returncode == 2
    assert "chmod 600" in r.stderr
    assert "Traceback" not in r.stderr
    assert KEY not in r.stderr


def test_binds_loopback_by_default_and_warns_when_public_without_key() -> None:
    cfg = config_from_args(["--upstream", "http://127.0.0.1:1"], env={})
    assert cfg.host == "127.0.0.1"
    assert security_warnings(cfg) == []
    public = ProxyConfig(upstreams=("http://x",), host="0.0.0.0")
    assert "WARNING" in security_warnings(public)[0]
    assert security_warnings(ProxyConfig(upstreams=("http://x",), host="0.0.0.0",
                                         api_keys=("k",))) == []


def test_public_bind_without_key_warns_on_stderr(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--host", "0.0.0.0")
    assert "WARNING: listening on 0.0.0.0 without an API key" in p.log()


# -- bad input ---------------------------------------------------------------------------------

BAD_BODIES: list[tuple[str, bytes]] = [
    ("malformed JSON", b'{"messages": [}'),
    ("not an object", b"[1, 2]"),
    ("messages wrong type", json.dumps({"messages": "hello"}).encode()),
    ("empty messages", json.dumps({"messages": []}).encode()),
    ("stream wrong type", json.dumps(CHAT | {"stream": "yes"}).encode()),
    ("max_tokens wrong type", json.dumps(CHAT | {"max_tokens": "ten"}).encode()),
    ("invalid UTF-8", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'),
    ("deeply nested", b'{"messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"),
    ("nested in extra field", b'{"messages": [{"role": "user", "content": "x"}], "x": '
     + b"[" * 5000 + b"]" * 5000 + b"}"),
    ("empty body", b""),
]


@pytest.mark.parametrize(("what", "body"), BAD_BODIES, ids=[w for w, _ in BAD_BODIES])
def test_bad_input_is_400_in_openai_format(proxy: ProxyProc, what: str, body: bytes) -> None:
    r = httpx.post(proxy.url + "/v1/chat/completions", content=body,
                   headers={"content-type": "application/json"})
    if what == "nested in extra field":  # valid JSON: the engine judges the rest
        assert r.status_code < 500
        return
    assert_openai_error(r, 400)


def test_ten_megabyte_body_is_413(proxy: ProxyProc) -> None:
    big = json.dumps({"messages": [{"role": "user", "content": "a" * 10_000_000}]})
    assert_openai_error(httpx.post(proxy.url + "/v1/chat/completions", content=big), 413)
    chunked = httpx.post(proxy.url + "/v1/completions",
                         content=iter([b'{"prompt": "', b"a" * 9_000_000, b'"}']))
    assert_openai_error(chunked, 413)
    assert httpx.get(proxy.url + "/health").status_code == 200


def post_in_background(url: str, n: int, timeout: float = 10) -> list[threading.Thread]:
    """``n`` one-token completions posted from threads, already started (join them)."""
    threads = [threading.Thread(target=httpx.post, args=(url + "/v1/completions",),
                                kwargs={"json": {"prompt": "x", "max_tokens": 1},
                                        "timeout": timeout})
               for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def test_too_many_in_flight_is_429_with_retry_after(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    # a queue timeout longer than the test: the queue stays full until the 429 is asked for
    p = spawn_proxy([sim_url], "--max-in-flight", "1", "--max-queue", "1",
                    "--queue-timeout", "30")
    # The engine holds the first request in flight (the second stays queued) until the 429 is
    # seen, however slow the machine; then it answers both at once.
    sim_control(sim_url, hold=True)
    threads = post_in_background(p.url, 2, timeout=30)
    assert wait_for(lambda: "toposerve_requests_queued 1.0" in httpx.get(p.url + "/metrics").text)
    r = httpx.post(p.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    error = assert_openai_error(r, 429)
    assert error["type"] == "rate_limit_error"
    assert int(r.headers["retry-after"]) >= 1
    sim_control(sim_url, hold=False)
    for t in threads:
        t.join()


def test_queue_wait_is_bounded(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--max-in-flight", "1", "--max-queue", "5",
                    "--queue-timeout", "0.3")
    sim_control(sim_url, hold=True)
    holder = threading.Thread(target=httpx.post, args=(p.url + "/v1/completions",),
                              kwargs={"json": {"prompt": "x", "max_tokens": 1}, "timeout": 20})
    holder.start()
    assert wait_for(lambda: sim_stats(sim_url)["running"] == 1)
    assert_openai_error(httpx.post(p.url + "/v1/completions", json={"prompt": "x"}), 429)
    # The queue timeout answered, not the slot freeing: the engine still holds the holder's
    # request (until let go below).
    assert holder.is_alive()
    assert sim_stats(sim_url)["running"] == 1
    sim_control(sim_url, hold=False)
    holder.join()


def _raw_exchange(url: str, payload: bytes, wait: float = 3.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        sock.sendall(payload)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except TimeoutError:
            pass
        return data


@pytest.mark.parametrize("header", [
    b"x-request-id: abc\rinjected: yes", b"x-evil: a\nset-cookie: b",
    b"bad header without colon", b"x-nul: a\x00b"])
def test_header_injection_is_refused_without_a_5xx(proxy: ProxyProc, header: bytes) -> None:
    body = json.dumps(CHAT).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n" + header + b"\r\n"
               b"content-type: application/json\r\nconnection: close\r\n"
               b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    reply = _raw_exchange(proxy.url, request)
    status = int(reply.split(b" ", 2)[1]) if reply else 0
    assert status in (0, 200, 400)
    assert b"injected" not in reply
    assert b"set-cookie" not in reply.lower()


def test_slow_headers_are_cut_off(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--header-timeout", "0.5")
    host, port = p.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        for _ in range(100):  # a header line every 0.1 s for 10 s, unless cut off
            try:
                sock.sendall(b"x-slow: 1\r\n")
            except OSError:
                break
            time.sleep(0.1)
        try:
            leftover = sock.recv(100)
        except TimeoutError:
            pytest.fail("the proxy kept the trickling connection open")
        except OSError:  # reset: the proxy closed while headers were still arriving
            leftover = b""
    assert leftover == b""  # closed, with nothing sent back


def test_slow_body_is_408(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--body-timeout", "0.5")
    payload = (b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
               b"content-type: application/json\r\n"
               b"content-length: 100\r\n\r\n{\"prompt\": ")
    reply = _raw_exchange(p.url, payload)
    assert reply.startswith(b"HTTP/1.1 408")  # only the body timeout answers 408


def test_many_idle_connections_do_not_block_others(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--header-timeout", "5")
    host, port = p.url.removeprefix("http://").split(":")
    idle = [socket.create_connection((host, int(port))) for _ in range(200)]
    try:
        for s in idle:
            s.sendall(b"GET /health HTTP/1.1\r\n")
        r = httpx.post(p.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 200
    finally:
        for s in idle:
            s.close()


def test_config_rejects_non_http_upstream() -> None:
    with pytest.raises(ConfigError, match="http://"):
        config_from_args(["--upstream", "127.0.0.1:8001"], env={})


def test_environment_keys_are_read() -> None:
    cfg = config_from_args(["--upstream", "http://h:1"], env={"TOPOSERVE_API_KEYS": "a,b"})
    assert cfg.api_keys == ("a", "b")


def test_queued_requests_are_counted(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--max-in-flight", "1", "--max-queue", "5")
    # the engine holds the first in its slot while the other two are counted
    sim_control(sim_url, hold=True)
    threads = post_in_background(p.url, 3, timeout=30)
    assert wait_for(lambda: "toposerve_requests_queued 2.0" in httpx.get(p.url + "/metrics").text)
    sim_control(sim_url, hold=False)  # it answers, and the queued two once admitted
    for t in threads:
        t.join()
    assert "toposerve_requests_queued 0.0" in httpx.get(p.url + "/metrics").text
