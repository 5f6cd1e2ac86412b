"""A request body in a transfer coding the proxy does not decode (``Transfer-Encoding: gzip,
chunked``: llhttp takes it, chunked being last) is a 501 saying to send it plainly (RFC 9112
6.1: a server SHOULD answer 501 to a transfer coding it does not understand). The proxy
de-chunked it and read the still-compressed bytes as the body: a 400 "request body is not
valid JSON" on the generation routes, and on the relayed routes the compressed bytes went to
the engine, the coding dropped, as if they were the JSON. Raw loopback sockets."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.server.conftest import ProxyProc, sim_stats
from tests.server.hostile import assert_route_error, connect, read_reply
from tests.server.test_local_guard import CHAT, MESSAGES


def chunked_post(proxy: ProxyProc, path: str, coding: str, body: bytes) -> tuple[int, object]:
    head = (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"transfer-encoding: {coding}\r\n\r\n").encode()
    with connect(proxy.url) as sock:
        sock.sendall(head + b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
        reply = read_reply(sock)
    return reply.status, reply.json()


def engine_requests(sim_url: str) -> int:
    return sum(n for route, n in sim_stats(sim_url)["by_route"].items() if route.startswith("/v1/"))


@pytest.mark.parametrize("coding", ["gzip, chunked", "deflate,chunked", "x-custom ,chunked",
                                    "GZIP , Chunked"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/embeddings"])
def test_a_transfer_coding_the_proxy_does_not_decode_is_a_501(
        proxy: ProxyProc, sim_url: str, path: str, coding: str) -> None:
    body = json.dumps(MESSAGES if path == "/v1/messages" else CHAT).encode()
    status, answer = chunked_post(proxy, path, coding, gzip.compress(body))
    assert status == 501, answer
    assert isinstance(answer, dict)
    assert_route_error(answer, path == "/v1/messages", "unsupported_transfer_encoding",
                       "api_error")  # Anthropic's type for a 5xx
    assert "Content-Length" in answer["error"]["message"]
    assert engine_requests(sim_url) == 0


@pytest.mark.parametrize("coding", ["chunked", "Chunked", " chunked "])
def test_plain_chunked_is_served(proxy: ProxyProc, sim_url: str, coding: str) -> None:
    status, _ = chunked_post(proxy, "/v1/chat/completions", coding, json.dumps(CHAT).encode())
    assert status == 200
