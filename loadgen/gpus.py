"""Per-GPU busy share and power during a run, from the target's toposerve GPU metrics.

When the target's /metrics (the toposerve proxy's) has `toposerve_gpu_utilization_ratio` or
`toposerve_gpu_power_watts`, a thread fetches it every `--gpu-sample` seconds while the run
lasts; only the text is kept, and it is parsed after the run (one GET every 2 s by default is
all loadgen pays). The scrape may cost the target more: the proxy's GPU collector reads NVML
inside /metrics (issue 17 measured about 50 ms per GPU on an H200), so `--gpu-sample 0` turns
sampling off where that matters. Per GPU: mean and max busy share and power over the samples.

The flag (the second study's advice: a card far below the other means an uneven split): a GPU
whose mean busy share or mean power is below half of the highest GPU's. Busy shares are compared
only when the busiest GPU was at least 5 % busy on average (otherwise the run left every GPU
idle and there is nothing to compare); power always is (an idle card still draws its idle power,
so half of a busy card's power is a card that sleeps).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

import httpx
from prometheus_client.parser import text_string_to_metric_families

UTIL = "toposerve_gpu_utilization_ratio"
POWER = "toposerve_gpu_power_watts"
LOW_SHARE = 0.5  # below half of the highest GPU's mean: flagged
MIN_BUSY = 0.05  # busy shares compared only when the busiest GPU averaged at least this
RULE = (
    f"a GPU is flagged when its mean busy share or mean power is below {LOW_SHARE:.0%} of the"
    f" highest GPU's (busy share only when the busiest averaged at least {MIN_BUSY:.0%})"
)


def has_gpu_metrics(metrics_text: str | None) -> bool:
    return bool(metrics_text) and (UTIL in metrics_text or POWER in metrics_text)  # type: ignore[operator]


@dataclass(frozen=True)
class Reading:
    gpu: str
    name: str
    util: float | None
    power_w: float | None


def readings(metrics_text: str) -> list[Reading]:
    """One reading per GPU of one scrape; unparsable text gives none."""
    util: dict[str, float] = {}
    power: dict[str, float] = {}
    names: dict[str, str] = {}
    try:
        families = list(text_string_to_metric_families(metrics_text))
    except ValueError:
        return []
    for family in families:
        for sample in family.samples:
            if sample.name not in (UTIL, POWER):
                continue
            gpu = sample.labels.get("gpu", "?")
            names.setdefault(gpu, sample.labels.get("name", ""))
            (util if sample.name == UTIL else power)[gpu] = sample.value
    return [
        Reading(gpu, names[gpu], util.get(gpu), power.get(gpu))
        for gpu in sorted(names, key=_gpu_order)
    ]


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


@dataclass(frozen=True)
class GpuStats:
    gpu: str
    name: str
    samples: int
    util_mean: float | None
    util_max: float | None
    power_mean_w: float | None
    power_max_w: float | None


@dataclass(frozen=True)
class Flag:
    gpu: str
    reason: str


@dataclass(frozen=True)
class GpuBalance:
    interval_s: float
    scrapes: int
    per_gpu: tuple[GpuStats, ...]
    flagged: tuple[Flag, ...]
    rule: str = RULE


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def balance(scrapes: Sequence[str], interval_s: float) -> GpuBalance:
    """Pure: the GPU table and flags from the scraped texts."""
    by_gpu: dict[str, list[Reading]] = {}
    for text in scrapes:
        for r in readings(text):
            by_gpu.setdefault(r.gpu, []).append(r)
    stats = []
    for gpu in sorted(by_gpu, key=_gpu_order):
        rows = by_gpu[gpu]
        utils = [r.util for r in rows if r.util is not None]
        powers = [r.power_w for r in rows if r.power_w is not None]
        stats.append(
            GpuStats(
                gpu,
                rows[0].name,
                len(rows),
                _mean(utils),
                max(utils, default=None),
                _mean(powers),
                max(powers, default=None),
            )
        )
    return GpuBalance(interval_s, len(scrapes), tuple(stats), tuple(flags(stats)))


def flags(stats: Sequence[GpuStats]) -> list[Flag]:
    if len(stats) < 2:
        return []
    out = []
    top_util = max((s.util_mean for s in stats if s.util_mean is not None), default=None)
    top_power = max((s.power_mean_w for s in stats if s.power_mean_w is not None), default=None)
    for s in stats:
        why = []
        if (
            top_util is not None
            and top_util >= MIN_BUSY
            and s.util_mean is not None
            and s.util_mean < LOW_SHARE * top_util
        ):
            why.append(f"busy {s.util_mean:.0%} against the busiest GPU's {top_util:.0%}")
        if top_power and s.power_mean_w is not None and s.power_mean_w < LOW_SHARE * top_power:
            why.append(f"power {s.power_mean_w:.0f} W against the highest {top_power:.0f} W")
        if why:
            out.append(Flag(s.gpu, "; ".join(why)))
    return out


class GpuMetricsPoller:
    """Fetches a /metrics URL every `interval_s` seconds in a thread while the block runs."""

    def __init__(self, url: str, interval_s: float, headers: dict[str, str] | None = None) -> None:
        self.url = url
        self.interval_s = interval_s
        self.texts: list[str] = []
        self._headers = headers or {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadgen-gpu-poller", daemon=True)

    def __enter__(self) -> GpuMetricsPoller:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with httpx.Client(headers=self._headers, timeout=5.0) as http:
            next_at = time.monotonic()
            while not self._stop.is_set():
                try:
                    response = http.get(self.url)
                    if response.status_code == 200:
                        self.texts.append(response.text)
                except httpx.HTTPError:
                    pass  # a missed sample: the others still count
                next_at += self.interval_s
                self._stop.wait(max(0.0, next_at - time.monotonic()))

    def result(self) -> GpuBalance:
        return balance(self.texts, self.interval_s)
