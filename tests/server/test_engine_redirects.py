"""An engine's redirect through the proxy, over raw loopback sockets against a real proxy in front
of a FastAPI engine (vLLM's server is one).

FastAPI answers a path with a trailing slash (``POST /v1/chat/completions/``) with a 307 whose
``Location`` is built from the request's Host, which the proxy sets to the engine's address:
the client was handed ``http://127.0.0.1:<engine port>/v1/chat/completions``, the engine's
address (an internal one on a multi-node deployment), and a client that follows redirects (the
OpenAI SDK does) went straight to the engine, past the proxy's key, limits and checks. Failed
on the code before its fix: the proxy now rewrites a ``Location`` that names the engine to the
path alone, as nginx's ``proxy_redirect default`` does, so the client comes back to the proxy.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.relay import proxied_location
from tests.server.conftest import SpawnProxy, free_port
from tests.server.hostile import exchange, post_json

ENGINE = """
import sys
import uvicorn
from fastapi import FastAPI
from fastapi.responses import RedirectResponse

app = FastAPI()

@app.get("/health")
def health():
    return {}

@app.get("/v1/models")
def models():
    return {"object": "list", "data": [{"id": "fastapi-model", "object": "model"}]}

@app.post("/v1/chat/completions")
def chat():
    return {"id": "c", "object": "chat.completion", "choices": []}

@app.get("/elsewhere")
def elsewhere():
    return RedirectResponse("https://example.com/docs", status_code=302)

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


@contextmanager
def fastapi_engine() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", ENGINE, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the FastAPI engine did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


CHAT = {"model": "fastapi-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("path", "headers"), [
    ("/v1/chat/completions/", {}),
    ("/v1/chat/completions/?x=1", {}),
    # the engine's uvicorn trusts X-Forwarded-Proto from the proxy's address (as vLLM's does)
    ("/v1/chat/completions/", {"x-forwarded-proto": "https"}),
])
def test_an_engine_redirect_sends_the_client_back_to_the_proxy_not_to_the_engine(
        spawn_proxy: SpawnProxy, path: str, headers: dict[str, str]) -> None:
    with fastapi_engine() as engine:
        p = spawn_proxy([engine])
        reply = post_json(p.url, path, CHAT, headers)
        assert reply.status == 307
        location = reply.headers["location"]
        engine_port = engine.rsplit(":", 1)[1]
        assert engine_port not in location
        assert location.startswith("/v1/chat/completions")
        # Followed, as a client does: it reaches the proxy again, and the engine through it.
        assert post_json(p.url, location, CHAT).status == 200


def test_a_redirect_to_another_site_passes_unchanged(spawn_proxy: SpawnProxy) -> None:
    with fastapi_engine() as engine:
        p = spawn_proxy([engine])
        reply = exchange(p.url, "GET", "/elsewhere")
        assert reply.status == 302
        assert reply.headers["location"] == "https://example.com/docs"


ENGINE_NETLOC = b"127.0.0.1:8001"


PATH_BYTES = st.binary(max_size=24) | st.lists(
    st.sampled_from([b"/", b"\\", b"\t", b" ", b"?", b"#", b"a", b".", b"%2f"]),
    max_size=8).map(b"".join)


@given(st.sampled_from([b"http://", b"HTTP://", b"https://", b"//", b""]), PATH_BYTES)
def test_any_location_is_a_path_on_the_proxy_or_left_as_it_is(scheme: bytes, rest: bytes) -> None:
    value = scheme + ENGINE_NETLOC + rest
    out = proxied_location(value, ENGINE_NETLOC)
    if out != value:
        # never one a browser reads as another host (WHATWG: tabs dropped, '\\' is '/')
        path = out.replace(b"\t", b"").replace(b"\n", b"").replace(b"\r", b"")
        assert path.startswith(b"/")
        assert path[1:2] not in (b"/", b"\\")
        assert out == rest.strip() or out == b"/" + rest.strip()


@given(st.from_regex(rb"\A(/([a-z0-9._-][a-z0-9/._-]*)?)?(\?[a-z0-9=&]*)?\Z"),
       st.sampled_from([b"http://", b"HTTP://", b"https://", b"//"]))
def test_a_location_naming_the_engine_becomes_its_path(rest: bytes, scheme: bytes) -> None:
    out = proxied_location(scheme + ENGINE_NETLOC + rest, ENGINE_NETLOC)
    assert out == (rest if rest.startswith(b"/") else b"/" + rest)
    # another port of the same host is another server: unchanged
    other = scheme + b"127.0.0.1:80011" + rest
    assert proxied_location(other, ENGINE_NETLOC) == other
