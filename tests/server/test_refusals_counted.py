"""A request the HTTP layer refuses before any route runs (a head over the limits, a refused
upgrade, invalid HTTP, no Host, a foreign transfer coding) is counted in
toposerve_requests_total with its route and status and has its access-log line, as every
answer of the routes has. They had neither: an operator saw no 431 or 400 of these anywhere
but in a free-text "refused a request" line (the app's own line was missing, or, where the app
had started, said its own status). Raw loopback sockets against a real proxy."""

from __future__ import annotations

import re

from tests.server.conftest import SpawnProxy
from tests.server.hostile import connect, metrics_text, read_reply

REFUSED = [  # (request bytes, route label, status)
    (b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: " + b"a" * 20_000 + b"\r\n\r\n",
     "/v1/models", 431),
    (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nupgrade: websocket\r\n"
     b"connection: upgrade\r\ncontent-length: 0\r\n\r\n", "/v1/chat/completions", 400),
    (b"POST /v1/messages HTTP/1.1\r\ncontent-length: 0\r\n\r\n", "/v1/messages", 400),
    (b"POST /v1/messages?beta=true HTTP/1.1\r\nhost: 127.0.0.1\r\ntransfer-encoding: gzip, "
     b"chunked\r\n\r\n0\r\n\r\n", "/v1/messages", 501),
    (b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nx-a: b\r\n c\r\n\r\n", "other", 400),
]


def requests_total(text: str, route: str, status: int) -> float:
    pattern = (rf'^toposerve_requests_total\{{model="unknown",route="{re.escape(route)}",'
               rf'status="{status}"\}} (\S+)$')
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_requests_the_http_layer_refuses_are_counted_and_logged(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url])
    for data, _, status in REFUSED:
        with connect(p.url) as sock:
            sock.sendall(data)
            assert read_reply(sock).status == status
    text = metrics_text(p.url)
    for route, status in {(r, s) for _, r, s in REFUSED}:
        expected = sum(1 for _, r, s in REFUSED if (r, s) == (route, status))
        assert requests_total(text, route, status) == expected, (route, status)
    access = [ln for ln in p.log().splitlines() if "toposerve.access" in ln]
    for _, route, status in REFUSED:
        assert any(f" {route} {status}" in ln for ln in access), (route, status, access)
