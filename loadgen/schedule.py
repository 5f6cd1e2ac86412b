"""Open-loop arrival times (pure): offsets in seconds from the start of the run."""

from __future__ import annotations

import random
from collections.abc import Iterator

ARRIVALS = ("poisson", "constant")


def arrival_offsets(
    rate: float, kind: str, seed: int, count: int | None = None, duration: float | None = None
) -> Iterator[float]:
    """Send times for `rate` requests/s: `count` of them, or all before `duration` seconds.

    Poisson arrivals have exponential gaps (mean 1/rate); constant ones are evenly spaced.
    The first request goes at 0 either way.
    """
    if kind not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {ARRIVALS}, not {kind!r}")
    rng = random.Random(f"{seed}:arrivals")
    t = 0.0
    sent = 0
    while (count is None or sent < count) and (duration is None or t < duration):
        yield t
        sent += 1
        t += rng.expovariate(rate) if kind == "poisson" else 1.0 / rate
