"""`launcher tune`'s statistics: a confidence interval per candidate, and when to stop. Pure.

Each candidate is measured in rounds (one loadgen run each); a round gives one score. The
interval is Student's t-interval of the mean score over the rounds (95%): rounds are few (2-5),
too few for a bootstrap to say anything a t-interval does not, and the t quantile widens the
interval honestly when they are few. One round gives no interval (it is unbounded both ways),
so a single round can never be "clearly ahead" of anything.

"Clearly ahead" is strict and pairwise: a candidate's lower bound above every other candidate's
upper bound. Overlapping intervals mean the measurement has not told them apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95

# Two-sided 95% Student t quantiles t(0.975, df) (standard tables). Past the table the value at
# the next smaller tabulated df is used: slightly wider than exact, never narrower.
_T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
    9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
    17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064,
    25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000,
    120: 1.980,
}


def t_quantile(df: int) -> float:
    """t(0.975, df) for df >= 1."""
    if df < 1:
        raise ValueError("a t-interval needs at least two values")
    return _T975[max(k for k in _T975 if k <= df)]


@dataclass(frozen=True)
class Interval:
    n: int
    mean: float
    low: float  # -inf with one value
    high: float  # +inf with one value

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    def above(self, other: Interval) -> bool:
        """This interval lies wholly above the other one."""
        return self.low > other.high


def t_interval(values: Sequence[float]) -> Interval:
    """Mean and 95% t-interval of ``values`` (at least one)."""
    if not values:
        raise ValueError("no values")
    n = len(values)
    mean = math.fsum(values) / n
    if n == 1:
        return Interval(1, mean, -math.inf, math.inf)
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t_quantile(n - 1) * math.sqrt(var / n)
    # Rounding can leave the mean a hair outside [mean-0, mean+0]; keep low <= mean <= high.
    return Interval(n, mean, min(mean - half, mean), max(mean + half, mean))


def clearly_ahead(intervals: Mapping[str, Interval]) -> str | None:
    """The candidate whose lower bound is above every other's upper bound, if one is."""
    for name, iv in intervals.items():
        if all(iv.above(other) for o, other in intervals.items() if o != name):
            return name if len(intervals) > 1 else None
    return None


def clearly_behind(iv: Interval, others: Mapping[str, Interval]) -> str | None:
    """A candidate already measured whose interval lies wholly above ``iv`` (the first found)."""
    for name, other in others.items():
        if other.above(iv):
            return name
    return None


def ranked(intervals: Mapping[str, Interval]) -> list[str]:
    """Names by mean score, best first (ties by name, so the order is stable)."""
    return sorted(intervals, key=lambda k: (-intervals[k].mean, k))


@dataclass(frozen=True)
class Step:
    action: str  # 'done' | 'rerun'
    names: tuple[str, ...]  # the finalists to re-run, or the clear leader when done
    reason: str


def next_step(intervals: Mapping[str, Interval], reruns_done: int, max_reruns: int) -> Step:
    """After a pass over the candidates: stop, or re-run the two finalists.

    Stop early when one candidate is clearly ahead of all others, or when the re-runs are used
    up. Otherwise re-run the finalists: the best by mean and the best of those whose interval
    overlaps it (the runner-up, unless the runner-up is already told apart and a noisier
    candidate further down is not), so that more rounds narrow both intervals.
    """
    if len(intervals) < 2:
        return Step("done", tuple(intervals), "one candidate measured: nothing to compare")
    leader = clearly_ahead(intervals)
    if leader is not None:
        return Step("done", (leader,), f"{leader} is clearly ahead: its interval lies above "
                    "every other's")
    order = ranked(intervals)
    first = order[0]
    rival = next((k for k in order[1:] if intervals[k].overlaps(intervals[first])), order[1])
    if reruns_done >= max_reruns:
        return Step("done", (), f"{first} and {rival} overlap after {reruns_done} re-run(s) of "
                    "the finalists: within the measurement's noise")
    return Step("rerun", (first, rival), f"{first} and {rival} overlap: re-running both")
