"""RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request that lacks a Host header. The
proxy served them (its Host check let a request without Host pass, as an HTTP/1.0 tool's),
on the lean generation routes and on uvicorn's alike. Every HTTP/1.1 client sends Host
(curl, the SDKs, browsers); HTTP/1.0 has no Host requirement and is still served. Raw
loopback sockets against a real proxy before the simulated engine."""

from __future__ import annotations

import json
import re

import pytest

from tests.server.conftest import ProxyProc
from tests.server.hostile import assert_route_error, connect, read_reply
from tests.server.test_local_guard import CHAT, MESSAGES, generations
from tests.server.test_pipelined_refusals import read_to_end

ROUTES = [  # (method, target, body): the lean front's, uvicorn's, and the Anthropic route
    ("POST", "/v1/chat/completions", json.dumps(CHAT).encode()),
    ("GET", "/v1/models", b""),
    ("POST", "/v1/messages", json.dumps(MESSAGES).encode()),
    ("POST", "http://127.0.0.1/v1/chat/completions", json.dumps(CHAT).encode()),  # absolute form
]
IDS = ["chat-lean", "models-uvicorn", "messages", "absolute-form"]


def head(method: str, target: str, body: bytes, version: str = "HTTP/1.1",
         host: str | None = None) -> bytes:
    lines = [f"{method} {target} {version}"] + ([f"host: {host}"] if host is not None else [])
    if body:
        lines += ["content-type: application/json", f"content-length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@pytest.mark.parametrize(("method", "target", "body"), ROUTES, ids=IDS)
def test_an_http_1_1_request_without_host_is_a_400_in_the_routes_format(
        proxy: ProxyProc, sim_url: str, method: str, target: str, body: bytes) -> None:
    with connect(proxy.url) as sock:
        sock.sendall(head(method, target, body))
        reply = read_reply(sock)
    assert reply.status == 400, reply.body
    answer = reply.json()
    assert_route_error(answer, target == "/v1/messages", "missing_host")
    assert "Host" in answer["error"]["message"]
    assert reply.closed
    assert generations(sim_url) == 0


@pytest.mark.parametrize(("method", "target", "body"), ROUTES[:2], ids=IDS[:2])
def test_a_request_without_host_after_a_served_one_is_a_400_after_its_answer(
        proxy: ProxyProc, sim_url: str, method: str, target: str, body: bytes) -> None:
    # Both in one write: the second waits for the first's answer, then is refused and the
    # connection closed.
    with connect(proxy.url) as sock:
        sock.sendall(head(method, target, body, host="127.0.0.1")
                     + head(method, target, body))
        got = read_to_end(sock)
    answers = re.split(rb"HTTP/1\.1 (?=\d{3} [A-Z])", got)[1:]  # status lines
    assert [a[:3] for a in answers] == [b"200", b"400"]
    assert b'"missing_host"' in answers[1]


@pytest.mark.parametrize(("method", "target", "body"), ROUTES[:3], ids=IDS[:3])
def test_an_http_1_0_request_without_host_is_served(
        proxy: ProxyProc, sim_url: str, method: str, target: str, body: bytes) -> None:
    with connect(proxy.url) as sock:
        sock.sendall(head(method, target, body, version="HTTP/1.0"))
        reply = read_reply(sock)
    assert reply.status == 200, reply.body


def test_an_http_1_1_request_with_host_is_served(proxy: ProxyProc, sim_url: str) -> None:
    method, target, body = ROUTES[0]
    with connect(proxy.url) as sock:
        sock.sendall(head(method, target, body, host="127.0.0.1"))
        reply = read_reply(sock, see_close=False)
    assert reply.status == 200
    assert generations(sim_url) == 1
