"""Readings of a running vLLM engine's own Prometheus metrics, for tests and benchmarks that
compare a client's figures with the engine's."""

from __future__ import annotations

import urllib.request


def engine_step_totals(url: str) -> tuple[float, float]:
    """(sum, count) of the engine at ``url``'s vllm:inter_token_latency_seconds histogram so far.

    vLLM stamps it in its engine core as each step's outputs are made, so neither its API server
    nor a client moves it: two readings around a run give the engine's own mean step over it."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    sums = {"_sum": 0.0, "_count": 0.0}
    for line in text.splitlines():
        for suffix in sums:
            if line.startswith(f"vllm:inter_token_latency_seconds{suffix}"):
                sums[suffix] += float(line.rsplit(" ", 1)[1])
    return sums["_sum"], sums["_count"]
