"""Soak: mixed streaming and non-streaming load with random client cancellations, through the
proxy to the simulated engine, for a long time; what drifts is what leaks.

    .venv/bin/python benchmarks/soak.py [--duration 1800] [--concurrency 32] [--window 60]
        [--ttft 0.05] [--itl 0.02] [--tokens 32] [--json FILE]

Every window it records requests served, errors by kind, p50 and p99 end-to-end latency of completed
streams, and the proxy's RSS and open file descriptors (from /proc). It reports the totals and
the drift between the first and last windows (the first window is warm-up for RSS/fds). Errors
count only what is the proxy's fault: the engine injects no faults here, and a cancellation is
the client's own doing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_overhead import free_port, proxy_process

from simengine.client import percentile, stream
from simengine.engine import SimConfig, spawn


@dataclass
class Window:
    t_end_s: float
    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    cancelled: int = 0
    e2e_s: list[float] = field(default_factory=list)
    rss_mib: float = 0.0
    fds: int = 0

    def summary(self) -> dict[str, object]:
        return {"t_end_s": round(self.t_end_s, 1), "requests": self.requests,
                "errors": dict(self.errors), "cancelled": self.cancelled,
                "e2e_p50_s": round(percentile(self.e2e_s, 50), 4),
                "e2e_p99_s": round(percentile(self.e2e_s, 99), 4), "rss_mib": self.rss_mib,
                "fds": self.fds}


@dataclass(frozen=True)
class SoakReport:
    duration_s: float
    requests: int
    cancelled: int
    errors: dict[str, int]
    p99_first_s: float
    p99_last_s: float
    # the median: what a queue building up raises for every request, where one stall of the
    # host moves a window's p99 (1-2 of ~120 requests) alone
    p50_first_s: float
    p50_last_s: float
    rss_first_mib: float
    rss_last_mib: float
    fds_first: int
    fds_last: int
    windows: list[dict[str, object]]

    @property
    def p99_drift(self) -> float:
        return self.p99_last_s / self.p99_first_s - 1 if self.p99_first_s else float("nan")


def proc_sample(pid: int) -> tuple[float, int]:
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return round(rss, 1), len(os.listdir(f"/proc/{pid}/fd"))


async def worker(url: str, tokens: int, itl: float, rng: random.Random, stop_at: float,
                 windows: list[Window], window_s: float, t0: float) -> None:
    while time.monotonic() < stop_at:
        kind = rng.choices(["stream", "plain", "cancel"], [60, 25, 15])[0]
        body = {"model": "sim-model", "prompt": "soak test prompt", "max_tokens": tokens,
                "ignore_eos": True, "stream": kind != "plain"}
        timeout = rng.uniform(0.0, tokens * itl) if kind == "cancel" else 60.0
        r = await stream(url + "/v1/completions", body, timeout=timeout)
        w = windows[min(len(windows) - 1, int((time.monotonic() - t0) / window_s))]
        w.requests += 1
        if kind == "cancel" and r.error is not None and r.error.startswith("TimeoutError"):
            w.cancelled += 1
        elif r.error is not None or r.status != 200:
            w.errors[_error_kind(r.error, r.status)] += 1
        elif kind == "stream":
            w.e2e_s.append(r.t_end - r.t_sent)


def _error_kind(error: str | None, status: int) -> str:
    if status >= 500:
        return f"http_{status}"
    if status and status != 200:
        return f"http_{status}"
    return (error or "unknown").split(":")[0]


async def sampler(pid: int, windows: list[Window], window_s: float, t0: float,
                  stop_at: float) -> None:
    for w in windows:
        await asyncio.sleep(max(0.0, t0 + w.t_end_s - time.monotonic()))
        w.rss_mib, w.fds = proc_sample(pid)
        # Progress as it goes (stderr), so a long run that is cut short still tells something.
        print(json.dumps({"t_end_s": round(w.t_end_s, 1), "rss_mib": w.rss_mib, "fds": w.fds,
                          "requests_so_far": w.requests}), file=sys.stderr, flush=True)
        if time.monotonic() >= stop_at:
            return


async def soak(url: str, pid: int, duration_s: float, concurrency: int, window_s: float,
               tokens: int, itl: float, seed: int = 0) -> SoakReport:
    t0 = time.monotonic()
    n_windows = max(2, round(duration_s / window_s))
    window_s = duration_s / n_windows
    windows = [Window(t_end_s=(i + 1) * window_s) for i in range(n_windows)]
    stop_at = t0 + duration_s
    rngs = [random.Random(seed * 1000 + i) for i in range(concurrency)]
    await asyncio.gather(sampler(pid, windows, window_s, t0, stop_at),
                         *(worker(url, tokens, itl, rng, stop_at, windows, window_s, t0)
                           for rng in rngs))
    errors: Counter[str] = Counter()
    for w in windows:
        errors.update(w.errors)
    first, last = windows[0], windows[-1]
    warm = windows[1] if len(windows) > 2 else first
    return SoakReport(
        duration_s=duration_s, requests=sum(w.requests for w in windows),
        cancelled=sum(w.cancelled for w in windows), errors=dict(errors),
        p99_first_s=percentile(first.e2e_s, 99), p99_last_s=percentile(last.e2e_s, 99),
        p50_first_s=percentile(first.e2e_s, 50), p50_last_s=percentile(last.e2e_s, 50),
        rss_first_mib=warm.rss_mib, rss_last_mib=last.rss_mib, fds_first=warm.fds,
        fds_last=last.fds, windows=[w.summary() for w in windows])


def run(duration_s: float, concurrency: int, window_s: float, ttft: float, itl: float,
        tokens: int) -> SoakReport:
    import uvloop

    with ExitStack() as stack:
        sim = stack.enter_context(spawn(SimConfig(ttft=ttft, itl=itl)))
        proxy, pid = stack.enter_context(proxy_process(sim, free_port()))
        return uvloop.run(soak(proxy, pid, duration_s, concurrency, window_s, tokens, itl))


def format_report(r: SoakReport) -> str:
    lines = [
        f"duration {r.duration_s:.0f} s: {r.requests} requests, {r.cancelled} cancelled by the "
        f"client, errors {r.errors or 'none'}",
        f"p99 e2e (streams): first window {r.p99_first_s * 1000:.1f} ms, last "
        f"{r.p99_last_s * 1000:.1f} ms (drift {r.p99_drift:+.1%}); p50 {r.p50_first_s * 1000:.1f} "
        f"-> {r.p50_last_s * 1000:.1f} ms",
        f"proxy RSS {r.rss_first_mib:.1f} -> {r.rss_last_mib:.1f} MiB, open fds {r.fds_first} "
        f"-> {r.fds_last} (after the first window)",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=1800.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--window", type=float, default=60.0)
    p.add_argument("--ttft", type=float, default=0.05)
    p.add_argument("--itl", type=float, default=0.02)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    report = run(a.duration, a.concurrency, a.window, a.ttft, a.itl, a.tokens)
    for w in report.windows:
        print(json.dumps(w))
    print(format_report(report))
    if a.json:
        a.json.write_text(json.dumps(asdict(report), indent=2))


if __name__ == "__main__":
    main()
