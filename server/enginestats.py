"""The engines' prefix-cache counters, re-exported at the proxy's /metrics.

A client that sees only the proxy (loadgen's agent workload, a Grafana panel) cannot reach the
engines' own /metrics, and the prefix-cache hit rate is what tells whether an agent's growing
context is being reused. So a scrape of the proxy reads ``vllm:prefix_cache_queries`` and
``vllm:prefix_cache_hits`` from every healthy replica and exports them per replica as
``toposerve_engine_prefix_cache_{queries,hits}_total``.

Concurrent scrapes share one read of the engines, and a scrape within ``MIN_INTERVAL_S`` of the
last read takes its values (an open /metrics must not let anyone turn a flood of scrapes into
load on the engines); a replica that cannot be read keeps its last values, so that a counter
does not seem to reset while an engine is briefly slow.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

KEYS = ("queries", "hits")
MIN_INTERVAL_S = 0.5


def prefix_cache_counters(text: str) -> dict[str, float] | None:
    """``{"queries": q, "hits": h}`` summed over vLLM's label sets, or None when the text has
    neither counter. Only the lines of those two counters are parsed, so a large or partly
    malformed exposition elsewhere does not matter."""
    names = {f"vllm:prefix_cache_{key}{end}": key for key in KEYS for end in ("", "_total")}
    sums = dict.fromkeys(KEYS, 0.0)
    seen = False
    for line in text.splitlines():
        if not line.startswith("vllm:prefix_cache_"):
            continue
        try:
            # A sample line alone parses as an untyped family of that sample's own name.
            samples = [s for f in text_string_to_metric_families(line + "\n") for s in f.samples]
        except (ValueError, TypeError, IndexError):
            continue  # one malformed line is skipped, not the whole scrape
        for sample in samples:
            key = names.get(sample.name)
            if key is not None and math.isfinite(sample.value) and sample.value >= 0:
                sums[key] += sample.value
                seen = True
    return sums if seen else None


Fetch = Callable[[str], Awaitable[str | None]]  # an engine URL to its /metrics text, or None


class EngineCacheStats(Collector):
    """The last prefix-cache counters read from each replica, refreshed before a scrape."""

    def __init__(self, min_interval_s: float = MIN_INTERVAL_S) -> None:
        self._last: dict[str, dict[str, float]] = {}
        self._refresh: asyncio.Task[None] | None = None
        self._min_interval_s = min_interval_s
        self._read_at: float | None = None  # loop time the last read ended

    async def refresh(self, urls: Iterable[str], fetch: Fetch) -> None:
        """Read every URL's counters, or wait for the read under way (shielded: a scraper
        that gives up does not cut it short for the others)."""
        loop = asyncio.get_running_loop()
        if self._read_at is not None and loop.time() - self._read_at < self._min_interval_s:
            return
        task = self._refresh
        if task is None or task.done():
            task = self._refresh = loop.create_task(self._read_all(list(urls), fetch))
        await asyncio.shield(task)

    async def _read_all(self, urls: list[str], fetch: Fetch) -> None:
        try:
            texts = await asyncio.gather(*(fetch(u) for u in urls))
        finally:
            self._read_at = asyncio.get_running_loop().time()
        for url, text in zip(urls, texts, strict=True):
            counters = prefix_cache_counters(text) if text is not None else None
            if counters is not None:
                self.update(url, counters)

    def update(self, url: str, counters: Mapping[str, float]) -> None:
        self._last[url] = dict(counters)

    def collect(self) -> Iterator[Metric]:
        if not self._last:
            return
        for key in KEYS:
            family = CounterMetricFamily(
                f"toposerve_engine_prefix_cache_{key}",
                f"Prefix-cache {key} (in tokens) of each engine replica, from its "
                f"vllm:prefix_cache_{key}", labels=["upstream"])
            for url, counters in sorted(self._last.items()):
                family.add_metric([url], counters[key])
            yield family

    def describe(self) -> list[Metric]:
        return []  # unchecked: the series exist only once an engine has been read
