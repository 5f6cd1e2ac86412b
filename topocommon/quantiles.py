"""The one percentile every package reports: linear interpolation between the two nearest
ranks (numpy's default), so that the planner's simulated TTFT p50, loadgen's measured one and
the simulated engine's client read a distribution the same way."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (``q`` in 0..100) of values already sorted; ValueError on none."""
    if not ordered:
        raise ValueError("percentile of no values")
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
