"""No file-descriptor or memory growth across 10,000 requests with faults mixed in (measured)."""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from pathlib import Path

from server.simclient import stream
from tests.server.conftest import SpawnProxy, sim_control

TOTAL = 10_000
WARMUP = 1_500


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def mixed_load(url: str, n: int, seed: int) -> Counter[str]:
    """Streams, plain answers, engine kills, engine errors, and clients that give up early."""
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    sem = asyncio.Semaphore(24)

    async def one() -> None:
        kind = rng.choices(["stream", "plain", "kill", "status", "cancel", "bad"],
                           [60, 15, 8, 5, 8, 4])[0]
        body: dict[str, object] = {"prompt": "a b c", "max_tokens": 3, "stream": kind != "plain"}
        headers = [("x-sim-fault", {"kill": "kill-after=1", "status": "status=503"}.get(kind, ""))]
        if kind == "bad":
            body = {"prompt": {"not": "valid"}, "stream": "no"}
        timeout = 0.004 if kind == "cancel" else 30.0
        async with sem:
            r = await stream(url + "/v1/completions", body, headers, timeout=timeout)
        outcomes[f"{kind}:{r.status}"] += 1

    await asyncio.gather(*(one() for _ in range(n)))
    return outcomes


def test_no_fd_or_memory_growth_across_ten_thousand_requests(spawn_proxy: SpawnProxy,
                                                             sim_url: str) -> None:
    sim_control(sim_url, ttft=0.0, itl=0.0)
    p = spawn_proxy([sim_url])
    warm = asyncio.run(mixed_load(p.url, WARMUP, seed=1))
    fds0, rss0 = open_fds(p.pid), rss_bytes(p.pid)
    rest = asyncio.run(mixed_load(p.url, TOTAL - WARMUP, seed=2))
    fds1, rss1 = open_fds(p.pid), rss_bytes(p.pid)
    outcomes = warm + rest
    print(f"fds {fds0}->{fds1}, rss {rss0 / 2**20:.1f}->{rss1 / 2**20:.1f} MiB, {dict(outcomes)}")
    assert sum(outcomes.values()) == TOTAL
    assert not [k for k in outcomes if k.endswith(":500")], outcomes
    assert outcomes["kill:200"] > 0
    assert outcomes["status:503"] > 0
    assert outcomes["bad:400"] > 0
    assert fds1 - fds0 <= 8, (fds0, fds1)
    assert rss1 - rss0 <= 12 * 1024 * 1024, (rss0, rss1)
