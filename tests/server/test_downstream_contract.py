"""The relay's one seam to the HTTP server (server.downstream), as a contract: under each server
the proxy can run on, the same bytes reach the client (the direct per-token write where the
server offers one, ``send`` where it does not), and a client that leaves aborts the engine's
request on every generation route, relayed streams included.

Servers: the real configuration (server.front's lean path, handing everything else to uvicorn's
httptools protocol with the disconnect hook), uvicorn's own httptools protocol (its cycle, no
hook: a watcher task), and uvicorn's h11 protocol (plain ASGI, nothing uvicorn-specific). The
proxy runs in this process so that the test can see which downstream and writer served a
stream; clients are raw loopback sockets.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn

from server import relay
from server.config import ProxyConfig
from server.serve import uvicorn_config
from tests.server.conftest import free_port, sim_control, sim_stats, wait_for
from tests.server.rawhttp import connect, exchange, request_bytes

SERVERS = {"front": {}, "httptools": {"http": "httptools"}, "h11": {"http": "h11"}}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "a b"}]},
    "/v1/completions": {"prompt": "a b"},
    "/v1/messages": {"messages": [{"role": "user", "content": "a b"}]},
    "/v1/responses": {"input": "a b"},
}


@dataclass
class Served:
    url: str
    kind: str
    seen: list[tuple[str, str]] = field(default_factory=list)  # (downstream, writer) per stream


@pytest.fixture(scope="module", params=list(SERVERS))
def served(request: pytest.FixtureRequest, _shared_sim: str) -> Iterator[Served]:
    kind = request.param
    port = free_port()
    result = Served(f"http://127.0.0.1:{port}", kind)
    made = relay._Stream.__init__

    def recording(self: Any, r: Any, call: Any, guard: Any, resp: Any, down: Any) -> None:
        made(self, r, call, guard, resp, down)
        result.seen.append((type(down).__name__, type(self.writer).__name__))

    patch = pytest.MonkeyPatch()
    patch.setattr(relay._Stream, "__init__", recording)
    cfg = ProxyConfig(upstreams=(_shared_sim,), port=port, idle_timeout_s=5)
    server = uvicorn.Server(uvicorn_config(cfg, log_level="warning", **SERVERS[kind]))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert wait_for(lambda: server.started, timeout=15), "the in-process proxy did not start"
    try:
        yield result
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        patch.undo()


@pytest.fixture
def proxy(served: Served, sim_url: str) -> Served:
    served.seen.clear()
    return served


def body(path: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    size = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
    return {"model": "sim-model", size: max_tokens, "stream": stream, **BODIES[path]}


def blank(raw: bytes) -> bytes:
    """The stream with its per-request id and time blanked (they differ between two asks)."""
    out = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            obj = json.loads(line[6:])
            for holder in (obj, obj.get("message"), obj.get("response")):
                if isinstance(holder, dict):
                    for key in ("id", "created", "created_at", "item_id"):
                        if key in holder:
                            holder[key] = key
            if "item_id" in obj:
                obj["item_id"] = "item_id"
            line = b"data: " + json.dumps(obj).encode()
        out.append(line)
    return b"\n".join(out)


# What serves a stream: the downstream the serving protocol injected in the disconnect hook.
# The lean path writes token events itself (Exchange); the guarded uvicorn protocol (a relayed
# route goes through it and FastAPI, whose send wraps the cycle's) injects the cycle's, whose
# transport is written directly (CycleWriter). Protocols that inject nothing (uvicorn's bare
# httptools and h11 ones) get plain ASGI, through send: the relay asks no type what it is.
EXPECTED = {
    ("front", "/v1/chat/completions"): ("LeanDownstream", "Exchange"),
    ("front", "/v1/messages"): ("CycleDownstream", "CycleWriter"),
    ("httptools", "/v1/chat/completions"): ("AsgiDownstream", "NoneType"),
    ("httptools", "/v1/messages"): ("AsgiDownstream", "NoneType"),
    ("h11", "/v1/chat/completions"): ("AsgiDownstream", "NoneType"),
    ("h11", "/v1/messages"): ("AsgiDownstream", "NoneType"),
}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_every_server_delivers_the_engines_stream_through_its_downstream(
        proxy: Served, sim_url: str, path: str) -> None:
    ask = body(path, 20, stream=True)
    if path == "/v1/chat/completions":
        ask["stream_options"] = {"include_usage": True}  # nothing stripped: bytes comparable
    direct = exchange(sim_url, "POST", path, ask)
    got = exchange(proxy.url, "POST", path, ask)
    assert got.status == 200
    assert blank(got.body) == blank(direct.body)
    assert proxy.seen == [EXPECTED[(proxy.kind, path)]]


def test_direct_writes_fall_back_to_send_when_the_writer_declines(
        proxy: Served, sim_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A writer that is never ready (as a paused socket, or a uvicorn without what it reads):
    # every token goes through the request's task and Downstream.write, with the same bytes.
    from server import front, uvicorn_adapter

    monkeypatch.setattr(front.Exchange, "ready", lambda self: False)
    monkeypatch.setattr(uvicorn_adapter.CycleWriter, "ready", lambda self: False)
    ask = {**body("/v1/completions", 20, stream=True), "stream_options": {"include_usage": True}}
    direct = exchange(sim_url, "POST", "/v1/completions", ask)
    got = exchange(proxy.url, "POST", "/v1/completions", ask)
    assert blank(got.body) == blank(direct.body)


def leave(proxy: Served, path: str, stream: bool, after_first_bytes: bool, reset: bool) -> None:
    with connect(proxy.url) as sock:
        sock.sendall(request_bytes("POST", path, json.dumps(body(path, 4000, stream)).encode()))
        if after_first_bytes:
            first = sock.recv(65536)
            assert first.startswith(b"HTTP/1.1 200")
            while b"\r\n\r\n" in first and first.endswith(b"\r\n\r\n"):  # headers only so far
                first += sock.recv(65536)
        else:
            assert wait_for(lambda: sim_stats(proxy_sim(proxy))["running"] == 1)
        if reset:  # an abrupt end (RST) rather than a close (FIN)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


_SIMS: dict[str, str] = {}


def proxy_sim(proxy: Served) -> str:
    return _SIMS[proxy.url]


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("phase", ["mid-stream", "before-first-token", "not-streamed"])
@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_client_leaving_aborts_the_engine_request_on_every_route(
        proxy: Served, sim_url: str, path: str, phase: str, how: str) -> None:
    _SIMS[proxy.url] = sim_url
    if phase != "mid-stream":
        sim_control(sim_url, ttft=30.0)  # the engine is still working on it when the client goes
    leave(proxy, path, stream=phase != "not-streamed", after_first_bytes=phase == "mid-stream",
          reset=how == "reset")
    assert wait_for(lambda: sim_stats(sim_url)["aborted"] == 1, timeout=10), sim_stats(sim_url)
    stats = sim_stats(sim_url)
    assert stats["running"] == 0
    assert stats["completed"] == 0  # aborted, not finished (4,000 tokens or a 30 s TTFT)


def test_only_the_adapter_reaches_into_uvicorn() -> None:
    # uvicorn's public Config and Server (server.serve) are fine; its protocols, cycles and
    # server state are private, and live in server/uvicorn_adapter.py alone.
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "server"
    reaching = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.startswith("uvicorn.") for n in names):
                reaching.append(path.name)
    assert sorted(set(reaching)) == ["uvicorn_adapter.py"]
