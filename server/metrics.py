"""The proxy's Prometheus metrics (names agreed in the team's metrics list) and the NVML GPU
collector. Every metric lives in an injected registry. NVML is read by ``GpuSampler`` in a
thread on an interval, never by a scrape: its calls take tens of milliseconds per GPU, and a
scrape runs on the event loop that relays every stream."""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from server.config import PLAN_LABELS

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
                   7.5, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1,
               0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0)
KNOWN_ROUTES = frozenset({
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/embeddings", "/v1/messages",
    "/v1/responses", "/tokenize", "/detokenize", "/v1/audio/transcriptions", "/pooling",
    "/classify", "/score", "/rerank", "/v1/rerank", "/version",
})
MAX_MODEL_LABELS = 32
# With --workers N, what a scrape of one worker shows of the others (merge_worker_metrics):
# families that describe the proxy's own work (requests, in flight, queued, latencies, tokens,
# errors, refusals) are each worker's share and are summed; these describe state every worker
# sees alike (the engines' health and their own counters, the plan, the GPUs) and come from one
# worker, the answering one where it has them.
WORKER_SHARED_PREFIXES = ("toposerve_upstream_up", "toposerve_plan_info", "toposerve_gpu_",
                          "toposerve_engine_")


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry, plan: Mapping[str, str]) -> None:
        r = registry
        self.requests = Counter("toposerve_requests_total", "Requests answered by the proxy",
                                ["model", "route", "status"], registry=r)
        self.in_flight = Gauge("toposerve_requests_in_flight", "Requests being answered",
                               ["model", "route"], registry=r)
        self.queued = Gauge("toposerve_requests_queued", "Requests waiting for admission",
                            registry=r)
        self.ttft = FastHistogram("toposerve_ttft_seconds", "Time to first token at the proxy",
                                  ("model", "route"), LATENCY_BUCKETS, r)
        self.itl = FastHistogram("toposerve_itl_seconds", "Gaps between token events at the proxy",
                                 ("model", "route"), ITL_BUCKETS, r)
        self.e2e = FastHistogram("toposerve_e2e_seconds", "Request start to last byte",
                                 ("model", "route"), LATENCY_BUCKETS, r)
        self.prompt_tokens = Counter("toposerve_prompt_tokens", "Prompt tokens (from usage)",
                                     ["model"], registry=r)
        self.generation_tokens = Counter("toposerve_generation_tokens",
                                         "Generated tokens (from usage)", ["model"], registry=r)
        self.upstream_errors = Counter("toposerve_upstream_errors", "Engine failures by kind",
                                       ["upstream", "kind"], registry=r)
        self.client_stalls = Counter("toposerve_client_stalls", "Clients disconnected because "
                                     "their socket took nothing for --client-stall-timeout",
                                     registry=r)
        # --max-connections (server.conncap): new connections answered 503 because every open
        # one was busy, and idle ones closed to make room
        self.connections_refused = Counter(
            "toposerve_connections_refused", "Connections answered 503 at accept: "
            "--max-connections open, all busy", registry=r)
        self.idle_connections_closed = Counter(
            "toposerve_idle_connections_closed", "Idle client connections closed to make room "
            "under --max-connections", registry=r)
        self.upstream_up = Gauge("toposerve_upstream_up", "1 while the engine replica is healthy",
                                 ["upstream"], registry=r)
        info = Gauge("toposerve_plan_info", "The plan in force", list(PLAN_LABELS), registry=r)
        info.labels(**{k: plan.get(k, "") for k in PLAN_LABELS}).set(1)
        self._models: set[str] = set()
        self._served: frozenset[str] | None = None  # what the engines list in /v1/models
        self._routes: dict[tuple[str, str], RouteMetrics] = {}
        self._usage: dict[str, tuple[Any, Any]] = {}

    def route(self, model: str, route: str) -> RouteMetrics:
        """The children of one (model, route), cached: ``labels()`` takes a lock each call."""
        key = (model, route)
        found = self._routes.get(key)
        if found is None:
            found = self._routes[key] = RouteMetrics(self, model, route)
        return found

    def count_usage(self, model: str, prompt: int, generated: int) -> None:
        """Token counters of one answer; their children cached per model (no ``labels()``
        lock per request), and made only once a model has usage, as before."""
        children = self._usage.get(model)
        if children is None:
            children = self._usage[model] = (self.prompt_tokens.labels(model),
                                             self.generation_tokens.labels(model))
        children[0].inc(prompt)
        children[1].inc(generated)

    def serve_models(self, names: Iterable[str]) -> None:
        """The model names the engines serve (their /v1/models): from then on only these are
        labels, so names an engine rejects cannot take the label slots."""
        served = frozenset(n for n in names if isinstance(n, str) and 0 < len(n) <= 128)
        self._served = frozenset(sorted(served)[:MAX_MODEL_LABELS])

    def model_label(self, model: object) -> str:
        """A bounded label: clients choose model names, so only names the engines serve are
        kept (until those are known, the first few seen)."""
        if not isinstance(model, str) or not model:
            return "unknown"
        served = self._served
        if served is not None:
            return model if model in served else "other"
        if model in self._models:
            return model
        if len(self._models) < MAX_MODEL_LABELS and len(model) <= 128:
            self._models.add(model)
            return model
        return "other"


class HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value


class FastHistogram(Collector):
    """A histogram for the per-token path: one bisect and two additions per observation.

    prometheus_client's Histogram takes a lock and walks every bucket on each observe; the
    proxy observes every inter-token gap on one event-loop thread, so neither is needed.
    """

    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...],
                 buckets: tuple[float, ...], registry: CollectorRegistry) -> None:
        self.name, self.doc, self.labelnames, self.buckets = name, doc, labelnames, buckets
        self.children: dict[tuple[str, ...], HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = HistogramChild(self.buckets)
        return child

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.doc, labels=list(self.labelnames))]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=list(self.labelnames))
        for values, child in list(self.children.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(self.buckets, child.counts, strict=False):
                cumulative += count
                buckets.append((_le(bound), cumulative))
            buckets.append(("+Inf", cumulative + child.counts[-1]))
            family.add_metric(list(values), buckets, child.sum)
        yield family


def _le(bound: float) -> str:
    return repr(float(bound))


class RouteMetrics:
    __slots__ = ("_requests", "_statuses", "e2e", "in_flight", "itl", "model", "route", "ttft")

    def __init__(self, metrics: ProxyMetrics, model: str, route: str) -> None:
        self.model, self.route = model, route
        self.in_flight = metrics.in_flight.labels(model, route)
        self.ttft = metrics.ttft.labels(model, route)
        self.itl = metrics.itl.labels(model, route)
        self.e2e = metrics.e2e.labels(model, route)
        self._requests = metrics.requests
        self._statuses: dict[int, Any] = {}

    def count(self, status: int) -> None:
        child = self._statuses.get(status)
        if child is None:
            child = self._statuses[status] = self._requests.labels(self.model, self.route,
                                                                   str(status))
        child.inc()


def route_label(path: str) -> str:
    return path if path in KNOWN_ROUTES else "other"


def _sample_gpus() -> list[Any]:
    try:
        from topocommon.nvml import sample_gpus
    except ImportError:
        return []
    return list(sample_gpus())


class GpuSampler:
    """NVML read every ``interval_s`` in a daemon thread; ``latest`` (what a scrape calls)
    returns the last reading at once, never waiting for NVML. pynvml's calls are ctypes calls,
    which release the GIL, so the event loop runs while a reading is under way."""

    def __init__(self, interval_s: float, sampler: Callable[[], list[Any]] | None = None) -> None:
        self.interval_s = interval_s
        self._sampler = sampler or _sample_gpus
        self._latest: list[Any] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> list[Any]:
        return self._latest

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="toposerve-nvml", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()  # the thread ends after its current reading (daemon: never waited on)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._latest = list(self._sampler())
            except Exception as exc:  # NVML failing must not end the sampling
                logging.getLogger("toposerve").debug("GPU sampling failed: %s", exc)
                self._latest = []
            self._stop.wait(self.interval_s)


class GpuCollector(Collector):
    """toposerve_gpu_* from ``sampler`` (the proxy gives it ``GpuSampler.latest``, so a scrape
    only reads the last reading; by default NVML itself, for one-off use as in
    tests/deploy/record_gpu_metrics.py); nothing where there is no GPU or no NVML."""

    FIELDS = (
        ("utilization_ratio", "toposerve_gpu_utilization_ratio", "GPU busy fraction"),
        ("memory_used_bytes", "toposerve_gpu_memory_used_bytes", "GPU memory in use"),
        ("memory_total_bytes", "toposerve_gpu_memory_total_bytes", "GPU memory size"),
        ("power_watts", "toposerve_gpu_power_watts", "GPU power draw"),
        ("pcie_tx_bytes_per_second", "toposerve_gpu_pcie_tx_bytes_per_second", "PCIe TX rate"),
        ("pcie_rx_bytes_per_second", "toposerve_gpu_pcie_rx_bytes_per_second", "PCIe RX rate"),
        ("nvlink_tx_bytes_total", "toposerve_gpu_nvlink_tx_bytes_total", "NVLink bytes sent"),
        ("nvlink_rx_bytes_total", "toposerve_gpu_nvlink_rx_bytes_total", "NVLink bytes received"),
    )

    def __init__(self, sampler: Callable[[], Iterable[Any]] | None = None) -> None:
        self._sampler = sampler or _sample_gpus

    def _samples(self) -> list[Any]:
        sampler = self._sampler
        try:
            return list(sampler())
        except Exception:  # a scrape must never fail because NVML did
            return []

    def collect(self) -> Iterator[Metric]:
        samples = self._samples()
        if not samples:
            return
        for attr, name, doc in self.FIELDS:
            family = GaugeMetricFamily(name, doc, labels=["gpu", "name"])
            for s in samples:
                value = getattr(s, attr, None)
                if value is not None:
                    family.add_metric([str(s.index), str(s.name)], float(value))
            yield family


def merge_worker_metrics(texts: Iterable[str], configured: int) -> list[Metric]:
    """One exposition for all workers from each worker's own (the answering worker's first):
    the rule above, plus ``toposerve_workers`` (configured) and ``toposerve_workers_scraped``
    (how many of them this answer counts: one too busy to answer in time is left out)."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    scraped = 0
    for text in texts:
        scraped += 1
        for family in text_string_to_metric_families(text):
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(family.name, family.documentation,
                                                      family.type, family.unit)
                values[family.name] = {}
            elif family.name.startswith(WORKER_SHARED_PREFIXES):
                continue  # one worker speaks for all
            into = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                into[key] = into.get(key, 0.0) + sample.value
    for name, metric in merged.items():
        metric.samples = [Sample(sample_name, dict(labels), value)
                          for (sample_name, labels), value in values[name].items()]
    workers = GaugeMetricFamily("toposerve_workers", "Proxy worker processes (--workers)",
                                value=configured)
    counted = GaugeMetricFamily("toposerve_workers_scraped", "Workers whose metrics this "
                                "answer sums (one busy past the wait is left out)", value=scraped)
    return [*merged.values(), workers, counted]


class MetricList:
    """Families already collected, in the shape ``generate_latest`` reads."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
