"""Active health checks of the engine replicas: GET <upstream>/health every interval; a replica
failing it is taken out of routing, one passing it is put back (the relay also takes a replica
out at once when a connection to it fails)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from server.config import ProxyConfig
from server.metrics import ProxyMetrics
from server.router import Router, Upstream
from server.upstream import Pool, UpstreamError

log = logging.getLogger("toposerve")
HEALTH_TIMEOUT_S = 2.0
SLOW_CHECKS_TO_FAIL = 3


class HealthChecker:
    def __init__(self, cfg: ProxyConfig, router: Router, metrics: ProxyMetrics,
                 pools: Mapping[str, Pool]) -> None:
        self.cfg = cfg
        self.router = router
        self.metrics = metrics
        self.pools = pools
        self._task: asyncio.Task[None] | None = None
        for up in router.upstreams:
            metrics.upstream_up.labels(up.url).set(1 if up.up else 0)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await self.check_all(timeout_s=HEALTH_TIMEOUT_S)
            await asyncio.sleep(self.cfg.health_interval_s)

    async def check_all(self, timeout_s: float) -> None:
        await asyncio.gather(*(self._check(up, timeout_s) for up in self.router.upstreams))

    async def _check(self, up: Upstream, timeout_s: float) -> None:
        slow = False
        try:
            async with asyncio.timeout(timeout_s):
                resp = await self.pools[up.url].request("GET", "/health", (), b"")
                try:
                    await resp.read()
                finally:
                    resp.finish()
            ok = resp.status == 200
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
