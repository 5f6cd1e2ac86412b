"""A request body with a Content-Encoding (gzip, deflate, br...) is refused with 415 on every
route, before any engine sees it. The proxy read such a body as it came: its media-URL check
(server.guard) searched the compressed bytes, found no ``url"`` and relayed them, header and
all, to the engine. An engine that decodes request content codings (cpp-httplib's servers do
when built with zlib; gateways in front of an engine may) then fetched the URL from inside.
Found by sending a gzip-compressed Anthropic image request naming 169.254.169.254: the
simulated engine got it with ``content-encoding: gzip``. Raw loopback sockets."""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

import pytest

from tests.server.conftest import ProxyProc, sim_stats
from tests.server.hostile import assert_route_error, connect, read_reply
from tests.server.test_local_guard import CHAT, generations

INSIDE = "http://169.254.169.254/latest/meta-data/"
BODIES = {  # each names a media URL inside: refused when sent plainly
    "/v1/messages": {"model": "sim-model", "max_tokens": 2, "messages": [{
        "role": "user", "content": [{"type": "image", "source": {"type": "url", "url": INSIDE}}]}]},
    "/v1/responses": {"model": "sim-model", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": INSIDE}]}]},
    "/v1/chat/completions": {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": INSIDE}}]}]},
}
CODINGS = {"gzip": gzip.compress, "deflate": zlib.compress, "x-gzip": gzip.compress}


def post(proxy: ProxyProc, path: str, body: bytes, encoding: str | None) -> tuple[int, Any]:
    lines = [f"POST {path} HTTP/1.1", "host: 127.0.0.1", "content-type: application/json",
             f"content-length: {len(body)}", "connection: close"]
    if encoding is not None:
        lines.append(f"content-encoding: {encoding}")
    with connect(proxy.url) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        reply = read_reply(sock, see_close=False)
    return reply.status, reply.json()


def engine_requests(sim_url: str) -> int:
    return sum(n for route, n in sim_stats(sim_url)["by_route"].items() if route.startswith("/v1/"))


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("coding", list(CODINGS))
def test_a_compressed_body_is_refused_before_the_engine_sees_it(
        proxy: ProxyProc, sim_url: str, path: str, coding: str) -> None:
    plain = json.dumps(BODIES[path]).encode()
    assert post(proxy, path, plain, None)[0] == 400  # the media check, on the plain body
    status, answer = post(proxy, path, CODINGS[coding](plain), coding.upper())
    assert status == 415, answer
    assert_route_error(answer, path == "/v1/messages", "unsupported_content_encoding")
    assert "uncompressed" in answer["error"]["message"]
    assert engine_requests(sim_url) == 0


def test_identity_is_no_encoding_and_is_served(proxy: ProxyProc, sim_url: str) -> None:
    status, _ = post(proxy, "/v1/chat/completions", json.dumps(CHAT).encode(), "identity")
    assert status == 200
    assert generations(sim_url) == 1
