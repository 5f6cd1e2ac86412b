"""Running the proxy: ``run(config)`` is what ``python -m server`` calls.

uvicorn with uvloop and httptools serves the app; its protocol is extended with what
server.front enforces on the lean path too (``Guards``): a header timeout (a client trickling
its request headers, slowloris, is cut off), bounded request heads (431), refused upgrades, and
a client that stops reading cut off; SIGTERM drains in-flight requests for
``drain_timeout_s`` before exiting.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import socket
import sys
from typing import Any

import uvicorn

from server.app import create_app
from server.config import ProxyConfig
from server.conncap import ConnectionCap, capped, default_limit
from server.front import Guards, front_protocol
from server.guard import exposure_line
from server.uvicorn_adapter import UvicornHost, guarded_protocol
from server.workers import Seat, listeners, split_limits, supervise

log = logging.getLogger("toposerve")
# The cyclic GC's young generation is collected after this many new container objects instead
# of CPython's 700: a 256-stream burst of 512-id prompts allocates that many every few
# requests, and each collection also walks whatever survived it (docs/benchmarks-proxy.md,
# "GC"). Garbage cycles still go, a little later; memory per request is unchanged.
GC_GEN0_THRESHOLD = 10_000


def settle_heap() -> None:
    """Before serving: what start-up built (modules, the app, its routes and pydantic models,
    some hundreds of thousands of objects) is moved out of the collector's reach
    (``gc.freeze``), so that a full collection under load walks only what serving created: on
    a 2-core machine at 256 streams full collections were ~50 ms of CPU each, every request
    of the burst waiting behind them. Done in the parent before workers fork, the frozen
    objects are also never written by a collection, so their pages stay shared."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


def security_warnings(cfg: ProxyConfig) -> list[str]:
    if cfg.loopback_only or cfg.api_keys:
        return []
    return [f"WARNING: listening on {cfg.host} without an API key: anyone who can reach this "
            "address can use the model. Pass --api-key/--api-key-file (or set "
            "TOPOSERVE_API_KEYS), or bind to 127.0.0.1."]


def uvicorn_config(cfg: ProxyConfig, seat: Seat | None = None,
                   **overrides: Any) -> uvicorn.Config:
    app = create_app(cfg, seat=seat)
    guards = Guards(header_timeout_s=cfg.header_timeout_s,
                    max_header_line_bytes=cfg.max_header_line_bytes,
                    max_header_bytes=cfg.max_header_bytes,
                    stall_timeout_s=cfg.client_stall_timeout_s,
                    on_stall=app.proxy.metrics.client_stalls.inc,
                    on_refused=app.proxy.refused_by_http_layer)
    settings: dict[str, Any] = dict(
        host=cfg.host, port=cfg.port, loop="uvloop", http=front_protocol(
            app, app.lean_handler(), guarded_protocol(guards), guards, UvicornHost),
        ws="none",  # no websockets are served: uvicorn must never switch a connection to one
        lifespan="on", access_log=False, log_level=cfg.log_level,
        timeout_graceful_shutdown=cfg.drain_timeout_s, server_header=False,
        timeout_keep_alive=75, log_config=None,
        proxy_headers=False)  # X-Forwarded-* are not used: no middleware for them per request
    if isinstance(settings["http"], type):  # open connections capped at accept (conncap)
        metrics = app.proxy.metrics
        settings["http"] = capped(settings["http"], ConnectionCap(
            cfg.max_connections or default_limit(), on_refused=metrics.connections_refused.inc,
            on_idle_closed=metrics.idle_connections_closed.inc))
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
    exposed = exposure_line(cfg.host, cfg.port, bool(cfg.api_keys), cfg.loopback_only)
    if exposed:
        log.info("%s", exposed)
    if cfg.workers <= 1:
        config = uvicorn_config(cfg)
        settle_heap()
        uvicorn.Server(config).run()
        return
    try:
        sockets = listeners(cfg.host, cfg.port, cfg.workers)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", cfg.host, cfg.port, exc)
        sys.exit(1)
    # the port chosen when 0 was asked for: the Host check (server.guard) names it
    share = dataclasses.replace(split_limits(cfg, cfg.workers), port=sockets[0].getsockname()[1])
    log.info("%d worker processes on port %d (per worker: --max-in-flight %d, --max-queue %d)",
             cfg.workers, sockets[0].getsockname()[1], share.max_in_flight, share.max_queue)

    def serve(seat: Seat, sock: socket.socket) -> None:
        config = uvicorn_config(share, seat)
        settle_heap()
        uvicorn.Server(config).run(sockets=[sock])

    settle_heap()  # the imports, before the fork: shared by every worker

    sys.exit(supervise(sockets, serve, cfg.drain_timeout_s + 5.0))
