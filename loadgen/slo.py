"""Service-level objectives and goodput (pure).

A request meets the SLO when it succeeded, its TTFT is at most `--slo-ttft-ms` and its TPOT
(time per output token after the first: (e2e − TTFT) / (completion − 1)) at most
`--slo-tpot-ms`; an objective not given is not judged. Goodput is what the requests that met it
delivered per second of the run: requests/s and output tokens/s. A level meets the SLO when at
least `--slo-share` of its requests did (default 0.9, i.e. "p90 within the objective"); a sweep
names the highest concurrency that does (`slo_best`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadgen.timing import RequestResult


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None
    tpot_s: float | None
    share: float = 0.9


@dataclass(frozen=True)
class SloResult:
    ttft_ms: float | None
    tpot_ms: float | None
    required_share: float
    met: int
    total: int
    share: float  # met / total (failed requests count as not met)
    goodput_req_s: float | None
    goodput_tok_s: float | None

    @property
    def meets(self) -> bool:
        return self.total > 0 and self.share >= self.required_share


def met(r: RequestResult, slo: Slo) -> bool:
    if not r.ok:
        return False
    if slo.ttft_s is not None and (r.ttft_s is None or r.ttft_s > slo.ttft_s):
        return False
    tpot = r.tpot_s  # None for a 1-token answer: nothing to judge
    return slo.tpot_s is None or tpot is None or tpot <= slo.tpot_s


def judge(results: Sequence[RequestResult], slo: Slo, duration_s: float) -> SloResult:
    good = [r for r in results if met(r, slo)]
    total = len(results)
    per_s = duration_s if duration_s > 0 else None
    return SloResult(
        ttft_ms=slo.ttft_s * 1000 if slo.ttft_s is not None else None,
        tpot_ms=slo.tpot_s * 1000 if slo.tpot_s is not None else None,
        required_share=slo.share,
        met=len(good),
        total=total,
        share=len(good) / total if total else 0.0,
        goodput_req_s=len(good) / per_s if per_s else None,
        goodput_tok_s=sum(r.completion_tokens or 0 for r in good) / per_s if per_s else None,
    )


def best_level(levels: Sequence[tuple[int | None, SloResult | None]]) -> int | None:
    """The highest concurrency whose level meets the SLO, or None when none does."""
    meeting = [c for c, s in levels if s is not None and s.meets and c is not None]
    return max(meeting, default=None)
