"""Run summaries as pure functions of per-request results."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadgen.slo import Slo, SloResult, judge
from loadgen.timing import RequestResult
from topocommon.quantiles import percentile

STATS = ("mean", "p50", "p90", "p99")


@dataclass(frozen=True)
class Dist:
    """Distribution of one measure; every field is None when there were no samples."""

    n: int
    mean: float | None = None
    std: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None

    def get(self, stat: str) -> float | None:
        value = getattr(self, stat)
        return value if isinstance(value, float) else None


@dataclass(frozen=True)
class LoopHealth:
    """How busy loadgen's own event loop was: if it lags, its timestamps do too."""

    lag_s: Dist
    cpu_fraction: float  # process CPU time / wall time, 1.0 = one core saturated


@dataclass(frozen=True)
class Summary:
    requests_ok: int
    requests_failed: int
    failures: dict[str, int]
    ttft_s: Dist
    itl_s: Dist
    e2e_s: Dist
    prefill_tok_s: Dist
    decode_tok_s: Dist
    output_tok_s: float | None
    total_tok_s: float | None
    duration_s: float
    send_lag_s: Dist | None = None
    loop: LoopHealth | None = field(default=None)
    headers_s: Dist | None = None  # time to response headers (server accepted the request)
    tpot_s: Dist | None = None  # (e2e − TTFT) / (completion − 1), what SLOs judge
    slo: SloResult | None = None
    max_in_flight: int = 0  # most requests between send and end at one moment


def dist(values: Sequence[float]) -> Dist:
    if not values:
        return Dist(n=0)
    ordered = sorted(values)
    mean = math.fsum(ordered) / len(ordered)
    var = (
        math.fsum((v - mean) ** 2 for v in ordered) / (len(ordered) - 1)
        if len(ordered) > 1
        else 0.0
    )
    return Dist(
        n=len(ordered),
        mean=mean,
        std=math.sqrt(var),
        p50=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        p99=percentile(ordered, 99),
        min=ordered[0],
        max=ordered[-1],
    )


def max_in_flight(results: Sequence[RequestResult]) -> int:
    """Most requests in flight at once (sent, not yet ended), from their raw timestamps."""
    edges = sorted([(r.sent_at, 1) for r in results] + [(r.done_at, -1) for r in results])
    most = now = 0
    for _, step in edges:  # an end at the same instant as a send is taken first
        now += step
        most = max(most, now)
    return most


def summarize(
    results: Sequence[RequestResult],
    window: tuple[float, float] | None,
    loop: LoopHealth | None = None,
    slo: Slo | None = None,
) -> Summary:
    """Summary of measured requests; `window` is (first sent, last done) of the run."""
    ok = [r for r in results if r.ok]
    duration = window[1] - window[0] if window else 0.0
    completion = sum(r.completion_tokens or 0 for r in ok)
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    lags = [r.send_lag_s for r in results if r.send_lag_s is not None]
    return Summary(
        requests_ok=len(ok),
        requests_failed=len(results) - len(ok),
        failures=dict(Counter(r.error for r in results if r.error is not None).most_common()),
        ttft_s=dist([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl_s=dist([gap for r in ok for gap in r.itl_s]),
        e2e_s=dist([r.e2e_s for r in ok]),
        prefill_tok_s=dist([r.prefill_tok_s for r in ok if r.prefill_tok_s is not None]),
        decode_tok_s=dist([r.decode_tok_s for r in ok if r.decode_tok_s is not None]),
        output_tok_s=completion / duration if duration > 0 and ok else None,
        total_tok_s=(prompt + completion) / duration if duration > 0 and ok else None,
        duration_s=duration,
        send_lag_s=dist(lags) if lags else None,
        loop=loop,
        headers_s=dist([r.headers_s for r in ok if r.headers_s is not None]),
        tpot_s=dist([t for r in ok if (t := r.tpot_s) is not None]),
        slo=judge(results, slo, duration) if slo is not None else None,
        max_in_flight=max_in_flight(results),
    )
