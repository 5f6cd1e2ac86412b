"""Whether a scenario's TTFT p50 sits on the edge of a gap: the record's and the plan's simulated
TTFTs around their medians, so that a p50 miss of a whole step is told from a cost model's.

    python benchmarks/gpu/issue22_median_gap.py RESULTS_DIR [OUT_DIR] [--scenario c32]
        [--case CASE ...] [--host-timing CASE=FILE ...] [--ranks K]

loadgen's closed loop at 32 streams sends 128 requests as four waves of 32, and vLLM's
8,192-token budget takes each wave's 512-token prompts in a few steps (1, then 15, then 16 where
nothing else runs): the TTFTs fall in a few tight groups a whole step (~0.2-0.3 s for a 12B
model) apart. The p50 (linear between the 64th and 65th of 128, topocommon.quantiles) then lies
inside a group, or, where exactly 64 requests are in the groups below a gap, halfway across it,
at a time no request had. One request on the other side moves the figure by half a step either
way; the figure says nothing of the steps' cost there. For each case this prints, for the record
and (with OUT_DIR, an issue22_now.py replay of RESULTS_DIR) the plan's simulated run behind its
figure (issue22_simwaves.chosen_run): the p50, the widest gap between consecutive TTFTs in the
middle half (its edges and how many requests lie below it), and the span of the p50 with up to K
requests moved across the median (:func:`p50_span`). Agreement, not validation: read after the
runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass(frozen=True)
class MedianGap:
    """The TTFTs around a median: ``p50`` as loadgen computes it; the widest gap between
    consecutive values in the middle half, from ``low`` to ``high`` seconds with ``below``
    values at or under ``low``; ``span`` the p50's range with up to ``ranks`` values moved
    across the median (:func:`p50_span`)."""

    n: int
    p50: float
    low: float
    high: float
    below: int
    span: tuple[float, float]

    def line(self) -> str:
        at = "in the gap" if self.low < self.p50 < self.high else "on a group"
        return (f"p50 {self.p50:.3f} ({at}); widest gap in the middle half {self.low:.3f}.."
                f"{self.high:.3f} with {self.below} of {self.n} below; "
                f"p50 span {self.span[0]:.3f}..{self.span[1]:.3f}")


def p50(values: list[float]) -> float:
    """loadgen's p50 (topocommon.quantiles.percentile: linear between the two middle values)."""
    sys.path.insert(0, str(ROOT))
    from topocommon.quantiles import percentile

    return percentile(sorted(values), 50)


def p50_span(values: list[float], ranks: int) -> tuple[float, float]:
    """The p50 with up to ``ranks`` values moved from above the median to below it or the other
    way (each moved value taken anywhere across): the order statistics ``ranks`` places either
    side of the two middle ones. A span as wide as a step says the figure turns on ``ranks``
    requests' side of a gap, not on how long the steps were."""
    v = sorted(values)
    n = len(v)
    lo = max((n - 1) // 2 - ranks, 0)
    hi = min(n // 2 + ranks, n - 1)
    return v[lo], v[hi]


def median_gap(values: list[float], ranks: int = 2) -> MedianGap:
    """The widest gap between consecutive values in the middle half of ``values`` (at least
    two), with the p50 and its span (:class:`MedianGap`)."""
    v = sorted(values)
    n = len(v)
    if n < 2:
        raise ValueError("a gap needs two values")
    first, last = n // 4, max(n - n // 4 - 1, n // 4 + 1)
    i = max(range(first, min(last, n - 1)), key=lambda k: v[k + 1] - v[k])
    return MedianGap(n, p50(v), v[i], v[i + 1], i + 1, p50_span(v, ranks))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("out", type=Path, nargs="?", default=None)
    ap.add_argument("--scenario", default="c32", choices=("c32", "long16-c4"))
    ap.add_argument("--case", action="append", default=[])
    ap.add_argument("--host-timing", action="append", default=[], metavar="CASE=FILE")
    ap.add_argument("--ranks", type=int, default=2)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import issue22_now
    from issue22_simwaves import chosen_run, planned_p50, replanned

    cases = a.case or sorted(p.name for p in a.results.iterdir()
                             if (p / f"{a.scenario}.json").is_file())
    planned: list[dict[str, object]] = []
    if a.out is not None:
        planned = [json.loads(x) for x in (a.out / "predictions.jsonl").read_text().splitlines()]
    hosts = {f.stem.removeprefix("host-cost-"): f.resolve()
             for f in a.results.glob("host-cost-*.json")}
    hosts.update({c: Path(f).resolve() for c, _, f in (h.partition("=") for h in a.host_timing)})
    prompt, conc = (int(issue22_now.SCENARIOS[a.scenario][i]) for i in (1, 5))
    for case in cases:
        f = a.results / case / f"{a.scenario}.json"
        if not f.is_file():
            continue
        reqs = json.loads(f.read_text())["requests"]
        meas = [float(r["ttft_s"]) for r in reqs if r.get("error") is None]
        print(f"{case} measured:  {median_gap(meas, a.ranks).line()}", flush=True)
        if a.out is None or not any(d.get("case") == case for d in planned):
            continue
        runs = [r for r in replanned(str(HERE / "issue22_simwaves.py"), case, a.scenario, a.out,
                                     hosts.get(case))
                if r["prompt"] == prompt and r["concurrency"] == conc]
        if not runs:
            print(f"{case} simulated: no run of {conc} x {prompt}")
            continue
        sim = [t for _, t, _ in chosen_run(runs, planned_p50(planned, case, a.scenario))]
        print(f"{case} simulated: {median_gap(sim, a.ranks).line()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
