"""The middleware the launcher loads into vLLM (launcher/engine/vllm_keyguard.py): vLLM's key on
every route but the probes, /invocations included, as a pure ASGI app driven in-process; and
that `launcher serve` hands it to vLLM exactly when vLLM gets a key."""

from __future__ import annotations

import asyncio
import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.engine import vllm_keyguard
from launcher.engine.vllm_keyguard import KeyGuard, key_matches

KEY = "engine-key-123"


def call(guard: KeyGuard, path: str, headers: list[tuple[bytes, bytes]],
         kind: str = "http", method: str = "POST") -> tuple[list[dict[str, Any]], bool]:
    """What ``guard`` sent for one request, and whether it passed it on to vLLM's app."""
    passed: list[bool] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        passed.append(True)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    guard.app = app
    scope = {"type": kind, "path": path, "method": method, "headers": headers}
    asyncio.run(guard(scope, receive, send))
    return sent, bool(passed)


@pytest.mark.parametrize("path", ["/invocations", "/tokenize", "/v1/completions", "/pooling",
                                  "/", "/scale_elastic_ep"])
def test_every_route_but_the_probes_needs_the_key(path: str) -> None:
    guard = KeyGuard(None, key=KEY)  # type: ignore[arg-type]
    sent, passed = call(guard, path, [])
    assert not passed
    assert sent[0]["status"] == 401
    assert json.loads(sent[1]["body"])["error"]["code"] == "invalid_api_key"
    for wrong in ([(b"authorization", b"Bearer nope")], [(b"authorization", KEY.encode())],
                  [(b"authorization", b"Bearer " + KEY.encode())] * 2):
        assert not call(guard, path, wrong)[1]
    assert call(guard, path, [(b"authorization", b"Bearer " + KEY.encode())])[1]
    assert call(guard, path, [(b"Authorization", b"bearer  " + KEY.encode())])[1]


@pytest.mark.parametrize("path", sorted(vllm_keyguard.OPEN_PATHS))
def test_the_probes_stay_open(path: str) -> None:
    assert call(KeyGuard(None, key=KEY), path, [], method="GET")[1]  # type: ignore[arg-type]


def test_a_websocket_without_the_key_is_closed_and_no_key_means_no_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent, passed = call(KeyGuard(None, key=KEY), "/v1/realtime", [],  # type: ignore[arg-type]
                        kind="websocket")
    assert (passed, sent) == (False, [{"type": "websocket.close", "code": 1008}])
    monkeypatch.setenv(vllm_keyguard.KEY_ENV, "")
    assert call(KeyGuard(None), "/invocations", [])[1]  # type: ignore[arg-type]
    monkeypatch.setenv(vllm_keyguard.KEY_ENV, KEY)  # as vLLM builds it: from the environment
    assert not call(KeyGuard(None), "/invocations", [])[1]  # type: ignore[arg-type]


@given(st.lists(st.tuples(st.sampled_from([b"authorization", b"Authorization", b"x"]),
                          st.binary(max_size=40)), max_size=4))
def test_only_one_bearer_header_with_the_key_matches(headers: list[tuple[bytes, bytes]]) -> None:
    auth = [v for k, v in headers if k.lower() == b"authorization"]
    expected = (len(auth) == 1 and auth[0].strip().partition(b" ")[0].lower() == b"bearer"
                and auth[0].strip().partition(b" ")[2].strip() == KEY.encode())
    assert key_matches(KEY.encode(), headers) == expected


def test_serve_hands_vllm_the_middleware_exactly_when_vllm_gets_a_key(tmp_path: Path) -> None:
    from launcher.engine.serve import Runner, Supervision
    from tests.serve.test_local_protection import spec_for

    replica = spec_for().replicas[0]
    sup = Supervision(log_dir=tmp_path)
    keyed = Runner.engine_child(replica, sup, "k").argv
    at = list(keyed).index("--middleware")
    assert keyed[at + 1] == vllm_keyguard.MIDDLEWARE
    assert "--middleware" not in Runner.engine_child(replica, sup, None).argv
    module, name = vllm_keyguard.MIDDLEWARE.rsplit(".", 1)  # as vLLM imports it
    assert getattr(importlib.import_module(module), name) is KeyGuard
