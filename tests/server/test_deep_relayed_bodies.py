"""A relayed body nested deeper than the proxy's JSON parser goes, over raw loopback sockets
against a real proxy. Failed on the code before its fix:

The media-URL check of relayed routes (/v1/messages, /v1/responses, ...) parses the body with
json.loads; a body it could not parse was relayed unchecked, as broken JSON the engine would
refuse too. But nesting is not brokenness: json.loads stops where the interpreter's
recursion guard does, which differs by version (3.11 under 1,000 levels; from 3.12 C code has
its own, higher limit), so a body with an internal image URL and 1,200 levels of nesting
elsewhere passed a proxy on 3.11 unchecked and could be read whole by a vLLM on 3.12 or
later, which fetched the URL. Now a
body too deep to check is refused (400, the route's error format), as on the generation routes.
"""

from __future__ import annotations

import json

import pytest

from tests.server.conftest import SpawnProxy
from tests.server.hostile import exchange, stand_in_engine


def refused_depth() -> int:
    """Levels of nesting this interpreter's json.loads refuses: 1,200 on 3.11, else the first
    of some deeper ones, so that the test holds on any Python."""
    for depth in (1200, 5000, 20_000, 100_000):
        try:
            json.loads("[" * depth + "]" * depth)
        except RecursionError:
            return depth
    raise AssertionError("this Python's json.loads read 100,000 levels of nesting")


DEPTH = refused_depth()
INSIDE = "http://169.254.169.254/latest/meta-data/"


def deep(body: dict[str, object]) -> bytes:
    text = json.dumps(body)
    return (text[:-1] + ', "x": ' + "[" * DEPTH + "]" * DEPTH + "}").encode()


BODIES = {
    "/v1/messages": {"model": "stand-in", "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "image",
                                      "source": {"type": "url", "url": INSIDE}}]}]},
    "/v1/responses": {"model": "stand-in", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": INSIDE}]}]},
}


@pytest.mark.parametrize("path", list(BODIES))
def test_a_body_too_deep_to_check_for_media_is_refused_not_relayed_unchecked(
        spawn_proxy: SpawnProxy, path: str) -> None:
    with stand_in_engine() as engine:
        p = spawn_proxy([engine.url])
        reply = exchange(p.url, "POST", path, {"content-type": "application/json"},
                         deep(BODIES[path]))
        assert reply.status == 400
        body = reply.json()
        error = body["error"]
        if path == "/v1/messages":
            assert body["type"] == "error"
            assert error["type"] == "invalid_request_error"
        else:
            assert error["code"] == "invalid_request"
        assert "nested too deeply" in error["message"]
        assert "flatter" in error["message"]
        assert engine.count(f"POST {path}") == 0


def test_a_shallow_body_with_a_public_media_url_is_still_relayed(spawn_proxy: SpawnProxy) -> None:
    with stand_in_engine(stream=[b"data: [DONE]\n\n"]) as engine:
        p = spawn_proxy([engine.url])
        body = json.dumps({**BODIES["/v1/responses"], "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}).encode()
        reply = exchange(p.url, "POST", "/v1/responses", {"content-type": "application/json"},
                         body)
        assert reply.status == 200
        assert engine.count("POST /v1/responses") == 1
