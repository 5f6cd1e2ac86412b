"""A method the proxy serves on no route there (TRACE, OPTIONS without CORS, PROPFIND...) is a
405 that carries ``Allow`` (RFC 9110 15.5.6: a 405 MUST) and says which methods the route takes,
in the route's format. The proxy's error handler rebuilt Starlette's 405 as its own error and
dropped its headers: ``TRACE /v1/chat/completions`` got 405 "Method Not Allowed" with no Allow
and nothing saying what to send. Raw loopback sockets against a real proxy."""

from __future__ import annotations

import pytest

from tests.server.conftest import ProxyProc
from tests.server.hostile import assert_route_error, exchange


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("TRACE", "/v1/chat/completions", "POST"), ("OPTIONS", "/v1/completions", "POST"),
    ("PROPFIND", "/health", "GET"), ("TRACE", "/v1/messages", "POST"),
    ("TRACE", "/v1/embeddings", "POST")])
def test_a_method_no_route_serves_is_a_405_with_allow_saying_what_to_send(
        proxy: ProxyProc, method: str, path: str, allowed: str) -> None:
    reply = exchange(proxy.url, method, path)
    assert reply.status == 405
    allow = [m.strip() for m in reply.headers["allow"].split(",")]
    assert allowed in allow
    answer = reply.json()
    assert_route_error(answer, path == "/v1/messages", "method_not_allowed")
    assert method in answer["error"]["message"]
    assert allowed in answer["error"]["message"]
