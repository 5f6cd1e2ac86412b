"""Running the proxy: ``run(config)`` is what ``python -m server`` calls.

uvicorn with uvloop and httptools serves the app; its protocol is extended with a header
timeout so that a client trickling its request headers (slowloris) is cut off, and SIGTERM
drains in-flight requests for ``drain_timeout_s`` before exiting.
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
from server.front import front_protocol

log = logging.getLogger("toposerve")


def protocol_with_header_timeout(timeout_s: float) -> type[asyncio.Protocol]:
    class HeaderTimeoutProtocol(HttpToolsProtocol):
        """Closes a connection whose request headers do not arrive within ``timeout_s``."""

        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._header_timer is None:  # a new connection's first request: armed already
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            # A fresh scope per request (made in on_message_begin): the relay registers there
            # what to call if the client leaves, instead of a task waiting on receive().
            extensions: dict[str, Any] = self.scope.setdefault("extensions", {})  # type: ignore[assignment]
            extensions[DISCONNECT_HOOK] = new_disconnect_hook()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
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

    return HeaderTimeoutProtocol


def security_warnings(cfg: ProxyConfig) -> list[str]:
    if cfg.loopback_only or cfg.api_keys:
        return []
    return [f"WARNING: listening on {cfg.host} without an API key: anyone who can reach this "
            "address can use the model. Pass --api-key/--api-key-file (or set "
            "TOPOSERVE_API_KEYS), or bind to 127.0.0.1."]


def uvicorn_config(cfg: ProxyConfig, **overrides: Any) -> uvicorn.Config:
    app = create_app(cfg)
    settings: dict[str, Any] = dict(
        host=cfg.host, port=cfg.port, loop="uvloop", http=front_protocol(
            app, app.proxy.generation, protocol_with_header_timeout(cfg.header_timeout_s),
            cfg.header_timeout_s),
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
