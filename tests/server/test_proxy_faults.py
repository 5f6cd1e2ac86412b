"""The proxy when the engine fails: killed, stalled, garbage, down, slow; and when the client
leaves at each phase — the engine's request must be aborted, not left generating."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from simengine.engine import SimConfig, spawn_process
from tests.server.conftest import ProxyProc, SpawnProxy, free_port, sim_control, sim_stats, wait_for

STREAM = {"prompt": "x", "max_tokens": 50, "stream": True}


def events(text: str) -> list[str]:
    return [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]


def ends_with_error(text: str, code: str) -> None:
    evs = events(text)
    assert evs[-1] == "[DONE]"
    error = json.loads(evs[-2])["error"]
    assert error["code"] == code
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("fault", ["kill-after=3", "end-after=3"])
def test_engine_killed_mid_stream_ends_with_error_event(proxy: ProxyProc, fault: str) -> None:
    # kill-after: the connection is reset; end-after: the body ends cleanly, without [DONE].
    r = httpx.post(proxy.url + "/v1/completions", json=STREAM, headers={"x-sim-fault": fault})
    assert r.status_code == 200
    ends_with_error(r.text, "stream_broken")
    assert len(events(r.text)) == 3 + 2


def test_engine_process_killed_mid_stream(spawn_proxy: SpawnProxy) -> None:
    with spawn_process(SimConfig(ttft=0.01, itl=0.05)) as (url, proc):
        p = spawn_proxy([url])
        with httpx.stream("POST", p.url + "/v1/completions", json=STREAM) as r:
            chunks = r.iter_text()
            first = next(chunks)
            killed_at = time.monotonic()
            proc.kill()
            rest = "".join(chunks)
            # not the 120 s idle timeout: the broken connection itself ended the stream
            assert time.monotonic() - killed_at < 30
        ends_with_error(first + rest, "stream_broken")
        after = httpx.post(p.url + "/v1/completions", json=STREAM)
        assert after.status_code == 503
        assert int(after.headers["retry-after"]) > 0
        assert httpx.get(p.url + "/ready").status_code == 503


def test_stalled_engine_hits_the_idle_timeout(proxy: ProxyProc, sim_url: str) -> None:
    t0 = time.monotonic()
    r = httpx.post(proxy.url + "/v1/completions", json=STREAM,
                   headers={"x-sim-fault": "stall-after=2"}, timeout=60)
    assert time.monotonic() - t0 >= 1.0  # not before the 1 s idle timeout
    ends_with_error(r.text, "timeout")  # cut by the proxy: the engine never ends it
    assert wait_for(lambda: sim_stats(sim_url)["aborted"] == 1)


def test_engine_silent_before_first_byte_is_a_504(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--first-byte-timeout", "0.5")
    r = httpx.post(p.url + "/v1/completions", json={"prompt": "x"},
                   headers={"x-sim-fault": "header-delay=3"})
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "engine_timeout"


def test_malformed_sse_is_not_forwarded(proxy: ProxyProc) -> None:
    r = httpx.post(proxy.url + "/v1/completions", json=STREAM,
                   headers={"x-sim-fault": "garbage-after=2"})
    ends_with_error(r.text, "malformed")
    assert b"broken" not in r.content
    assert len(events(r.text)) == 2 + 2


def test_malformed_json_answer_is_a_502(proxy: ProxyProc) -> None:
    r = httpx.post(proxy.url + "/v1/completions", json={"prompt": "x"},
                   headers={"x-sim-fault": "garbage"})
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "bad_engine_response"


def test_engine_errors_pass_through_with_their_status(proxy: ProxyProc) -> None:
    r = httpx.post(proxy.url + "/v1/completions", json={"prompt": "x"},
                   headers={"x-sim-fault": "status=503,retry-after=4"})
    assert r.status_code == 503
    assert r.headers["retry-after"] == "4"
    assert "error" in r.json()


def test_engine_closing_without_answer_is_a_503(proxy: ProxyProc) -> None:
    r = httpx.post(proxy.url + "/v1/completions", json={"prompt": "x"},
                   headers={"x-sim-fault": "close"})
    assert r.status_code == 503
    assert "retry-after" in r.headers


def test_no_engine_is_503_with_retry_after(spawn_proxy: SpawnProxy) -> None:
    p = spawn_proxy([f"http://127.0.0.1:{free_port()}"])
    r = httpx.post(p.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503
    assert int(r.headers["retry-after"]) > 0
    assert r.json()["error"]["type"] == "server_error"
    ready = httpx.get(p.url + "/ready")
    assert ready.status_code == 503
    assert "retry-after" in ready.headers
    assert httpx.get(p.url + "/health").status_code == 200


# -- the client leaves ------------------------------------------------------------------------


def _raw(url: str, payload: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(payload)
    return sock


def _request(body: dict[str, object], extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            f"content-type: application/json\r\n"
            f"content-length: {len(data)}\r\n{extra}\r\n")
    return head.encode() + data


@pytest.mark.parametrize("phase", ["before_first_token", "mid_stream", "non_streamed"])
def test_client_leaving_aborts_the_engine_request(proxy: ProxyProc, sim_url: str,
                                                  phase: str) -> None:
    sim_control(sim_url, ttft=0.3 if phase == "before_first_token" else 0.01, itl=0.02)
    body = {"prompt": "x", "max_tokens": 500, "stream": phase != "non_streamed"}
    sock = _raw(proxy.url, _request(body))
    if phase == "mid_stream":
        assert b"data:" in sock.recv(65536) or b"data:" in sock.recv(65536)
    assert wait_for(lambda: sim_stats(sim_url)["running"] == 1)
    sock.close()
    assert wait_for(lambda: sim_stats(sim_url)["aborted"] == 1, timeout=15)
    assert sim_stats(sim_url)["running"] == 0
    assert sim_stats(sim_url)["completed"] == 0


def test_client_leaving_during_its_body_sends_nothing_upstream(proxy: ProxyProc,
                                                               sim_url: str) -> None:
    sock = _raw(proxy.url, _request({"prompt": "x" * 1000})[:-500])
    time.sleep(0.2)
    sock.close()
    time.sleep(0.3)
    assert sim_stats(sim_url)["generations"] == 0
    assert httpx.get(proxy.url + "/health").status_code == 200


def queued_now(url: str) -> str:
    return next(line for line in httpx.get(url + "/metrics").text.splitlines()
                if line.startswith("toposerve_requests_queued "))


def test_client_leaving_while_queued_frees_its_place(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--max-in-flight", "1", "--max-queue", "4")
    # The engine holds the first request in its slot until the queued client has left and the
    # proxy has let go of its place, however slow the machine: held for a fixed 0.5 s instead,
    # a test process held up between the queued request and its close let the slot free first,
    # and the queued request was sent to the engine (generations 3).
    sim_control(sim_url, hold=True)
    holder = threading.Thread(target=httpx.post, args=(p.url + "/v1/completions",),
                              kwargs={"json": {"prompt": "x", "max_tokens": 1}, "timeout": 30})
    holder.start()
    assert wait_for(lambda: sim_stats(sim_url)["running"] == 1)
    queued = _raw(p.url, _request({"prompt": "x", "max_tokens": 1}))
    assert wait_for(lambda: queued_now(p.url) == "toposerve_requests_queued 1.0")
    queued.close()
    assert wait_for(lambda: queued_now(p.url) == "toposerve_requests_queued 0.0")
    sim_control(sim_url, hold=False)
    holder.join()
    r = httpx.post(p.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert r.status_code == 200
    assert sim_stats(sim_url)["generations"] == 2


def test_client_that_stops_reading_is_cut_off(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    # The stall cut-off is longer than the idle timeout: the engine keeps sending, so the
    # silence is the client's, and the proxy must say so (not blame the engine at 1 s).
    p = spawn_proxy([sim_url], "--idle-timeout", "1", "--client-stall-timeout", "2")
    sim_control(sim_url, ttft=0.0, itl=0.0001)  # 10,000 tokens/s, about 2 MB/s
    host, port = p.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(_request({"prompt": "x", "max_tokens": 90_000, "stream": True}))
    # It reads nothing: buffers fill, the proxy's send blocks, the stall cut-off fires.
    assert wait_for(lambda: sim_stats(sim_url)["aborted"] == 1, timeout=20)
    # The proxy let go of the socket: reading drains what was buffered, then the end.
    sock.settimeout(10)
    tail = b""
    while chunk := sock.recv(1 << 20):
        tail = (tail + chunk)[-400:]
    sock.close()
    assert b'"code": "timeout"' not in tail  # the engine was not at fault
    metrics = httpx.get(f"{p.url}/metrics").text
    assert "toposerve_client_stalls_total 1.0" in metrics
