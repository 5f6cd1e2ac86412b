"""Running the proxy: ``run(config)`` is what ``python -m server`` calls.

uvicorn with uvloop and httptools serves the app; its protocol is extended with what
server.front enforces on the lean path too (``Guards``): a header timeout (a client trickling
its request headers, slowloris, is cut off), bounded request heads (431), refused upgrades, and
a client that stops reading cut off; SIGTERM drains in-flight requests for
``drain_timeout_s`` before exiting.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from server.app import create_app
from server.asgi import DISCONNECT_HOOK, client_left, disconnect_hook, new_disconnect_hook
from server.config import ProxyConfig
from server.front import (
    UPGRADE_REFUSED,
    Guards,
    HeadLimit,
    Refusal,
    StallTimer,
    front_protocol,
    head_too_large,
    refuse,
    wants_upgrade,
)

log = logging.getLogger("toposerve")


def guarded_protocol(guards: Guards) -> type[asyncio.Protocol]:
    timeout_s = guards.header_timeout_s

    class GuardedProtocol(HttpToolsProtocol):
        """uvicorn's protocol, closing a connection whose request headers do not arrive
        within ``timeout_s``, bounding request heads, refusing upgrades and cutting off a
        client that stops reading (the same rules as server.front's)."""

        _header_timer: asyncio.TimerHandle | None = None
        _refused: Refusal | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head = HeadLimit(guards.max_header_line_bytes, guards.max_header_bytes)
            self._stall = StallTimer(self.loop, guards)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._refused is not None:
                self._refused.drop(data)
                return
            # Counted before httptools sees the bytes. The head is known to start after the
            # previous request's end, so the first chunk of a pipelined head can go uncounted:
            # the bound is looser by at most one read, never absent.
            over = self._head.feed(data)
            if over is not None:
                self._refuse(431, head_too_large(self._head, over), "header_too_large")
                return
            super().data_received(data)

        def _refuse(self, status: int, message: str, code: str) -> None:
            self._disarm()
            self._refused = refuse(self.transport, self.loop, self.server_state.default_headers,
                                   status, message, code)

        def _unsupported_upgrade_warning(self) -> None:
            if self._refused is None:  # pragma: no cover - every upgrade is refused first
                super()._unsupported_upgrade_warning()

        def on_message_begin(self) -> None:
            if self._refused is not None:
                return
            super().on_message_begin()
            if self._header_timer is None:  # a new connection's first request: armed already
                self._arm()

        def on_headers_complete(self) -> None:
            if self._refused is not None:
                return
            self._disarm()
            if self.parser.should_upgrade() or wants_upgrade(self.headers):
                self._refuse(400, UPGRADE_REFUSED, "upgrade_refused")
                return
            # A fresh scope per request (made in on_message_begin): the relay registers there
            # what to call if the client leaves, instead of a task waiting on receive().
            extensions: dict[str, Any] = self.scope.setdefault("extensions", {})  # type: ignore[assignment]
            extensions[DISCONNECT_HOOK] = new_disconnect_hook()
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if self._refused is None:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._refused is None:
                super().on_message_complete()
                self._head.reset()

        def pause_writing(self) -> None:
            super().pause_writing()
            self._stall.paused(self.transport)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._stall.resumed()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._stall.resumed()
            if self._refused is not None:
                self._refused.cancel()
            cycle = self.cycle
            super().connection_lost(exc)
            # uvicorn marks only the running cycle, and only before its response completed:
            # exactly when its receive() would have answered http.disconnect.
            hook = disconnect_hook(cycle.scope) if cycle is not None else None
            if cycle is not None and cycle.disconnected and hook is not None:
                client_left(hook)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            if self.cycle is None or self.cycle.response_complete:
                self.transport.close()

    return GuardedProtocol


def security_warnings(cfg: ProxyConfig) -> list[str]:
    if cfg.loopback_only or cfg.api_keys:
        return []
    return [f"WARNING: listening on {cfg.host} without an API key: anyone who can reach this "
            "address can use the model. Pass --api-key/--api-key-file (or set "
            "TOPOSERVE_API_KEYS), or bind to 127.0.0.1."]


def uvicorn_config(cfg: ProxyConfig, **overrides: Any) -> uvicorn.Config:
    app = create_app(cfg)
    guards = Guards(header_timeout_s=cfg.header_timeout_s,
                    max_header_line_bytes=cfg.max_header_line_bytes,
                    max_header_bytes=cfg.max_header_bytes,
                    stall_timeout_s=cfg.client_stall_timeout_s,
                    on_stall=app.proxy.metrics.client_stalls.inc)
    settings: dict[str, Any] = dict(
        host=cfg.host, port=cfg.port, loop="uvloop", http=front_protocol(
            app, app.proxy.generation, guarded_protocol(guards), guards),
        ws="none",  # no websockets are served: uvicorn must never switch a connection to one
        lifespan="on", access_log=False, log_level=cfg.log_level,
        timeout_graceful_shutdown=cfg.drain_timeout_s, server_header=False,
        timeout_keep_alive=75, log_config=None,
        proxy_headers=False)  # X-Forwarded-* are not used: no middleware for them per request
    settings.update(overrides)
    return uvicorn.Config(app, **settings)


def run(cfg: ProxyConfig) -> None:
    logging.basicConfig(level=cfg.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for line in security_warnings(cfg):
        log.warning(line)
        print(line, file=sys.stderr, flush=True)
    log.info("toposerve proxy on http://%s:%d -> %s (API keys: %d)", cfg.host, cfg.port,
             ", ".join(cfg.upstreams), len(cfg.api_keys))
    uvicorn.Server(uvicorn_config(cfg)).run()
