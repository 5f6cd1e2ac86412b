"""The proxy's own CPU time per request and per token, for one or two proxy builds side by side.

    .venv/bin/python benchmarks/proxy_cpu.py [--bursts 20] [--streams 64] [--tokens 64]
        [--other 'python other/checkout/-m server --upstream {upstream} --port {port}']
        [--route /v1/completions|/v1/chat/completions|/v1/messages] [--prompt-ids 512]

TTFT differences between the direct and the proxied path are a few ms on these shared two-core
machines and move by as much from one second to the next; the CPU the proxy process spends
(user + system, from /proc/PID/stat) is a far steadier measure of what a change did. One
simulated engine, this tree's proxy (and ``--other`` in front of the same engine), bursts of
``--streams`` concurrent streams alternating between the proxies: once with one token per
request (the per-request cost: connection, parsing, checks, upstream exchange, metrics) and
once with ``--tokens`` (the rest, divided by the extra tokens, is the per-token cost).
``--route`` picks what the streams ask for: the lean generation routes or a relayed one
(``/v1/messages``: FastAPI's surface and the relay without SSE inspection). ``--prompt-ids N``
sends prompts of N token ids (as benchmarks/proxy_overhead.py does): a request body of a few KiB.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_overhead import ROUTES, burst, free_port, proxy_process

from simengine.engine import SimConfig, spawn

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user + system time of ``pid`` so far (fields 14 and 15 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


@dataclass
class Tally:
    cpu_s: float = 0.0
    requests: int = 0


def measure(proxies: dict[str, tuple[str, int]], bursts: int, streams: int,
            tokens: int, route: str = "/v1/completions", prompt_ids: int = 0) -> dict[str, Tally]:
    """CPU per proxy over ``bursts`` bursts each, alternating so both see the same machine."""
    import uvloop

    tallies = {name: Tally() for name in proxies}
    for _ in range(bursts):
        for name, (url, pid) in proxies.items():
            before = cpu_seconds(pid)
            r = uvloop.run(burst(url, streams, tokens, 1, route, prompt_ids))
            if r.errors:
                raise SystemExit(f"{name}: {r.errors} of {streams} streams failed")
            tallies[name].cpu_s += cpu_seconds(pid) - before
            tallies[name].requests += streams
    return tallies


def per_unit(one: Tally, many: Tally, tokens: int) -> tuple[float, float]:
    """(µs per request, µs per extra token) from the 1-token and the ``tokens``-token runs."""
    per_request = one.cpu_s / one.requests
    extra = many.cpu_s / many.requests - per_request
    return per_request * 1e6, extra / max(tokens - 1, 1) * 1e6


def proxies_of(stack: ExitStack, sim: str,
               other: str | None) -> Iterator[tuple[str, tuple[str, int]]]:
    yield "this tree", stack.enter_context(proxy_process(sim, free_port()))
    if other:
        yield "other", stack.enter_context(proxy_process(sim, free_port(), other))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bursts", type=int, default=20)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--other", help="a second proxy command ({upstream}, {port}) to compare")
    p.add_argument("--route", choices=ROUTES, default="/v1/completions")
    p.add_argument("--prompt-ids", type=int, default=0)
    a = p.parse_args()
    import uvloop

    with ExitStack() as stack:
        # A fast engine: the proxy's CPU is the point, not the pace.
        sim = stack.enter_context(spawn(SimConfig(ttft=0.005, itl=0.002, max_model_len=1 << 20)))
        proxies = dict(proxies_of(stack, sim, a.other))
        for url, _ in proxies.values():  # warm the keep-alive pools and imports
            uvloop.run(burst(url, a.streams, 2, 1, a.route))
        one = measure(proxies, a.bursts, a.streams, 1, a.route, a.prompt_ids)
        many = measure(proxies, a.bursts, a.streams, a.tokens, a.route, a.prompt_ids)
    print(f"{a.bursts} bursts of {a.streams} streams each on {a.route}, 1 and {a.tokens} tokens "
          "per request, alternating")
    print(f"{'proxy':>10} {'µs/request':>11} {'µs/token':>9}")
    for name in proxies:
        req, tok = per_unit(one[name], many[name], a.tokens)
        print(f"{name:>10} {req:>11.0f} {tok:>9.1f}")


if __name__ == "__main__":
    main()
