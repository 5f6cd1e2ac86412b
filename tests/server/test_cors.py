"""CORS on a real proxy in front of the simulated engine, over raw sockets: a page from an origin
in --allowed-origins gets CORS headers on every answer (the lean generation path, routes relayed
through uvicorn, the proxy's own routes, errors) and its preflights answered; every other origin
gets none, and a keyless proxy keeps refusing it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server import guard
from tests.server.conftest import ProxyProc, SpawnProxy
from tests.server.test_local_guard import raw

APP = "http://app.example:3000"
EVIL = "http://evil.example"
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
HOST = ("host", "127.0.0.1")


@pytest.fixture
def keyless(spawn_proxy: SpawnProxy, sim_url: str) -> ProxyProc:
    return spawn_proxy([sim_url], "--allowed-origins", APP)


@pytest.fixture
def keyed(spawn_proxy: SpawnProxy, sim_url: str) -> ProxyProc:
    return spawn_proxy([sim_url], "--allowed-origins", APP, "--api-key", "k1")


def post(url: str, path: str, origin: str | None, body: object,
         extra: list[tuple[str, str]] = ()) -> tuple[int, dict[str, str], object]:
    headers = [HOST, ("content-type", "application/json"), *extra]
    if origin is not None:
        headers.append(("origin", origin))
    return raw(url, "POST", path, headers, json.dumps(body).encode())


def assert_cors(headers: dict[str, str], origin: str) -> None:
    assert headers["access-control-allow-origin"] == origin
    assert "origin" in headers["vary"].lower()
    assert "x-request-id" in headers["access-control-expose-headers"]
    assert "retry-after" in headers["access-control-expose-headers"]


def assert_no_cors(headers: dict[str, str]) -> None:
    assert not [k for k in headers if k.startswith("access-control-")], headers


def test_an_allowed_origin_gets_cors_headers_on_every_kind_of_answer(keyless: ProxyProc) -> None:
    status, headers, _ = post(keyless.url, "/v1/chat/completions", APP, CHAT)  # the lean path
    assert status == 200
    assert_cors(headers, APP)
    status, headers, _ = post(keyless.url, "/v1/chat/completions", APP,
                              {**CHAT, "stream": True})  # streamed through the same path
    assert status == 200
    assert_cors(headers, APP)
    status, headers, _ = raw(keyless.url, "GET", "/v1/models", [HOST, ("origin", APP)])
    assert status == 200  # relayed through uvicorn's protocol
    assert_cors(headers, APP)
    status, headers, _ = raw(keyless.url, "GET", "/health", [HOST, ("origin", APP)])
    assert status == 200  # the proxy's own route
    assert_cors(headers, APP)
    status, headers, body = post(keyless.url, "/v1/chat/completions", APP, {"model": 5})
    assert status == 400  # the page can read the error too
    assert_cors(headers, APP)
    assert isinstance(body, dict)
    assert body["error"]["type"] == "invalid_request_error"
    assert headers["access-control-allow-origin"].count(APP) == 1  # added once


def test_a_preflight_from_an_allowed_origin_is_answered_without_a_key(keyed: ProxyProc) -> None:
    status, headers, body = raw(keyed.url, "OPTIONS", "/v1/chat/completions", [
        HOST, ("origin", APP), ("access-control-request-method", "POST"),
        ("access-control-request-headers", "Content-Type, Authorization")])
    assert (status, body) == (204, None)
    assert_cors(headers, APP)
    assert "POST" in headers["access-control-allow-methods"]
    assert headers["access-control-allow-headers"] == "content-type, authorization"
    assert int(headers["access-control-max-age"]) > 0
    status, headers, _ = post(keyed.url, "/v1/chat/completions", APP, CHAT,
                              [("authorization", "Bearer k1")])
    assert status == 200
    assert_cors(headers, APP)
    status, headers, _ = post(keyed.url, "/v1/chat/completions", APP, CHAT)
    assert status == 401  # the key is still asked on the request itself
    assert_cors(headers, APP)


def test_other_origins_get_no_cors_and_a_keyless_proxy_still_refuses_them(
    keyless: ProxyProc,
) -> None:
    status, headers, _ = post(keyless.url, "/v1/chat/completions", EVIL, CHAT)
    assert status == 403
    assert_no_cors(headers)
    status, headers, _ = raw(keyless.url, "OPTIONS", "/v1/chat/completions", [
        HOST, ("origin", EVIL), ("access-control-request-method", "POST")])
    assert status == 403
    assert_no_cors(headers)
    # a loopback page passes the check as before, and gets no CORS header: none was allowed
    status, headers, _ = post(keyless.url, "/v1/chat/completions", "http://localhost:5173", CHAT)
    assert status == 200
    assert_no_cors(headers)
    status, headers, _ = post(keyless.url, "/v1/chat/completions", None, CHAT)
    assert status == 200
    assert_no_cors(headers)


def test_an_allowed_origin_on_a_rebinding_host_is_still_refused(keyless: ProxyProc) -> None:
    status, headers, _ = raw(keyless.url, "OPTIONS", "/v1/chat/completions", [
        ("host", "attacker.example"), ("origin", APP),
        ("access-control-request-method", "POST")])
    assert status == 403  # not answered as a preflight: the Host check comes first
    assert "access-control-allow-methods" not in headers


def test_without_allowed_origins_no_request_gets_cors(proxy: ProxyProc) -> None:
    status, headers, _ = post(proxy.url, "/v1/chat/completions", "http://localhost:5173", CHAT)
    assert status == 200
    assert_no_cors(headers)


POLICY = guard.policy("127.0.0.1", 8000, False, allowed_origins=[APP])


@pytest.mark.parametrize(("asked", "allowed"), [
    (b"content-type", b"content-type"),
    (b" X-Api-Key ,anthropic-version", b"x-api-key, anthropic-version"),
    (b"content-type\r\nx-evil: 1", None),
    (b"a b", None),
    (b"", None),
])  # fmt: skip
def test_a_preflight_allows_only_a_list_of_header_names(asked: bytes,
                                                         allowed: bytes | None) -> None:
    got = guard.preflight(APP.encode(), [(b"access-control-request-method", b"POST"),
                                         (b"access-control-request-headers", asked)])
    assert got is not None
    assert dict(got).get(b"access-control-allow-headers") == allowed


def test_an_options_request_without_a_requested_method_is_no_preflight() -> None:
    assert guard.preflight(APP.encode(), [(b"origin", APP.encode())]) is None


@given(st.lists(st.tuples(st.sampled_from([b"origin", b"access-control-request-method",
                                           b"access-control-request-headers", b"x"]),
                          st.binary(max_size=60)), max_size=5))
def test_any_request_head_gets_cors_only_for_an_allowed_origin(
    headers: list[tuple[bytes, bytes]],
) -> None:
    origin = guard.cors_origin(POLICY, headers)
    first = next((v for n, v in headers if n == b"origin"), None)
    if origin is not None:
        assert first is not None
        assert guard.normal_origin(first.decode("latin-1")) == APP
        answer = guard.preflight(origin, headers)
        if answer is not None:
            allowed = dict(answer).get(b"access-control-allow-headers", b"")
            assert b"\r" not in allowed
            assert b"\n" not in allowed
