"""A request refused by the HTTP layer (a head over the limits, an upgrade, not HTTP/1.1, no
Host) is answered in the format of the route it names, as the app answers it: Anthropic's on
/v1/messages however the target spells that route. The HTTP layer read the raw target, so an
absolute-form target (``POST http://127.0.0.1/v1/messages``, RFC 9112 3.2.2) and a
percent-encoded one (``/v1/%6dessages``, which the app routes as /v1/messages) got OpenAI's
shape. Raw loopback sockets against a real proxy."""

from __future__ import annotations

import pytest

from tests.server.conftest import ProxyProc
from tests.server.hostile import connect, read_reply

TARGETS = ["/v1/messages", "/v1/messages?beta=true", "http://127.0.0.1/v1/messages",
           "http://127.0.0.1:9/v1/messages?beta=true", "/v1/%6dessages",
           "/v1/messages%2Fcount_tokens"]
REFUSED = {  # header lines the HTTP layer refuses, before any app sees the request
    "header line over the limit": b"host: 127.0.0.1\r\nx-big: " + b"a" * 20_000 + b"\r\n",
    "upgrade": b"host: 127.0.0.1\r\nupgrade: websocket\r\nconnection: upgrade\r\n",
    "no host": b"",
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("what", list(REFUSED))
def test_a_refusal_on_the_anthropic_route_is_in_anthropics_format_however_it_is_spelled(
        proxy: ProxyProc, target: str, what: str) -> None:
    with connect(proxy.url) as sock:
        sock.sendall(b"POST %b HTTP/1.1\r\n%bcontent-length: 0\r\n\r\n"
                     % (target.encode(), REFUSED[what]))
        reply = read_reply(sock)
    assert 400 <= reply.status < 500
    answer = reply.json()
    assert answer["type"] == "error", answer
    assert answer["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("target", ["/v1/chat/completions", "http://127.0.0.1/v1/models",
                                    "/v1/%6dessage", "http://127.0.0.1/v1/messagesx"])
def test_a_refusal_elsewhere_is_in_openais_format(proxy: ProxyProc, target: str) -> None:
    with connect(proxy.url) as sock:
        sock.sendall(b"POST %b HTTP/1.1\r\n%bcontent-length: 0\r\n\r\n"
                     % (target.encode(), REFUSED["upgrade"]))
        reply = read_reply(sock)
    assert reply.json()["error"]["code"] == "upgrade_refused"
