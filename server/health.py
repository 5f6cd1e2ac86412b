"""Active health checks of the engine replicas: GET <upstream>/health every interval; a replica
failing it is taken out of routing, one passing it is put back (the relay also takes a replica
out at once when a connection to it fails). One probe of the replicas runs at a time: callers
arriving meanwhile (the loop, any number of /ready) wait for that one, so a slow engine is
counted slow once per probe, not once per caller. Every MODELS_EVERY probes the served model
names are read from /v1/models (the only names the metrics take as labels)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from server.config import ProxyConfig
from server.metrics import ProxyMetrics
from server.router import Router, Upstream
from server.upstream import Pool, UpstreamError
from topocommon import jsontext

log = logging.getLogger("toposerve")
HEALTH_TIMEOUT_S = 2.0
SLOW_CHECKS_TO_FAIL = 3
MODELS_EVERY = 30


async def model_entries(pool: Pool, timeout_s: float) -> list[dict[str, Any]] | None:
    """The entries (objects with a string ``id``) of an engine's /v1/models, or None when it
    does not answer one in time."""
    try:
        async with asyncio.timeout(timeout_s):
            status, body = await pool.get("/v1/models")
        listing = jsontext.loads(body) if status == 200 else None
    except (TimeoutError, UpstreamError, OSError, ValueError):
        return None
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        return None
    return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


class HealthChecker:
    def __init__(self, cfg: ProxyConfig, router: Router, metrics: ProxyMetrics,
                 pools: Mapping[str, Pool]) -> None:
        self.cfg = cfg
        self.router = router
        self.metrics = metrics
        self.pools = pools
        self._task: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None
        self._models_due = 0  # probes until /v1/models is read again
        for up in router.upstreams:
            metrics.upstream_up.labels(up.url).set(1 if up.up else 0)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        for task in (self._task, self._probe):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _loop(self) -> None:
        while True:
            await self.check_all(timeout_s=HEALTH_TIMEOUT_S)
            await asyncio.sleep(self.cfg.health_interval_s)

    async def check_all(self, timeout_s: float) -> None:
        """Probe every replica, or wait for the probe under way (shielded: a caller that
        gives up does not cut it short for the others)."""
        probe = self._probe
        if probe is None or probe.done():
            probe = self._probe = asyncio.get_running_loop().create_task(
                self._probe_all(timeout_s))
        await asyncio.shield(probe)

    async def _probe_all(self, timeout_s: float) -> None:
        await asyncio.gather(*(self._check(up, timeout_s) for up in self.router.upstreams))
        self._models_due -= 1
        unread = any(u.up and u.models is None for u in self.router.upstreams)
        if (self._models_due <= 0 or unread) and self.router.any_up:
            names = await self._served_models(timeout_s)
            if names is not None:
                self.metrics.serve_models(names)
                self._models_due = MODELS_EVERY

    async def _served_models(self, timeout_s: float) -> set[str] | None:
        """The ids in every healthy replica's /v1/models; None if none could be read."""
        found: set[str] | None = None
        for up in self.router.upstreams:
            if not up.up:
                continue
            entries = await model_entries(self.pools[up.url], timeout_s)
            ids = None if entries is None else {m["id"] for m in entries}
            if ids is not None:
                up.models = frozenset(ids)
                found = ids | (found or set())
        return found

    async def _check(self, up: Upstream, timeout_s: float) -> None:
        slow = False
        try:
            async with asyncio.timeout(timeout_s):
                status, _ = await self.pools[up.url].get(up.health_path)
                if status == 404 and up.health_path == "/health":
                    # An OpenAI-compatible server without vLLM's /health (Ollama, some
                    # hosted gateways): its model list answering is its health from now on.
                    log.info("engine %s has no /health: checking it with GET /v1/models", up.url)
                    up.health_path = "/v1/models"
                    status, _ = await self.pools[up.url].get(up.health_path)
            ok = status == 200
        except TimeoutError:
            ok, slow = False, True
        except (UpstreamError, OSError):
            ok = False
        # A refused connection or a failing answer takes the replica out at once; a slow answer
        # only when it repeats (a busy engine on shared cores is not a dead one).
        up.slow_checks = up.slow_checks + 1 if slow else 0
        if slow and up.up and up.slow_checks < SLOW_CHECKS_TO_FAIL:
            return
        if ok != up.up or not up.checked:
            log.log(logging.INFO if ok else logging.WARNING, "engine %s is %s", up.url,
                    "up" if ok else "down (taken out of routing until its /health passes)")
        up.up, up.checked = ok, True
        self.metrics.upstream_up.labels(up.url).set(1 if ok else 0)
