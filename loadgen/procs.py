"""--processes N: one level driven by N event loops in N processes, merged into one result.

One Python loop carries about 80,000 streamed tokens/s (docs/benchmarks-loadgen.md); past that
its own timestamps would run late. Split across processes, each loop keeps a share it can carry.
perf_counter is CLOCK_MONOTONIC on Linux, one clock for every process, so the raw records of all
workers lie on one time line and are measured exactly as if one loop had taken them.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import queue
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from loadgen.errors import LoadgenError
from loadgen.runner import Driven, Shape, drive, run_async
from loadgen.stats import LoopHealth, dist
from loadgen.timing import RawRequest
from loadgen.transport import Client, Endpoint
from loadgen.workload import Workload

_READY_TIMEOUT_S = 120.0
_START_MARGIN_S = 0.1  # all loops sleep until the same perf_counter time, then start


def split(total: int, parts: int) -> list[int]:
    """Near-equal shares of `total` that add up to it, largest first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def split_shape(shape: Shape, parts: int) -> list[Shape]:
    """Each process's share: streams, rate and request count divided; its own arrival seed."""
    conc = split(shape.concurrency, parts) if shape.concurrency else [None] * parts
    reqs = split(shape.requests, parts) if shape.requests else [None] * parts
    rate = shape.rate / parts if shape.rate else None
    return [
        replace(shape, concurrency=conc[i], requests=reqs[i], rate=rate, seed=shape.seed * 1009 + i)
        for i in range(parts)
    ]


@dataclass(frozen=True)
class Part:
    workload: Workload
    shape: Shape
    numbers: tuple[int, ...] | None  # --requests: this part's request numbers
    first: int  # --duration: numbers first, first + step, first + 2·step, ...
    step: int
    warmup: tuple[int, ...]


def plan_parts(
    workload: Workload,
    shape: Shape,
    parts: int,
    numbers: Sequence[int] | None,
    first: int,
    warmup: Sequence[int],
) -> list[Part]:
    """Pure: how one level is divided between `parts` processes (numbers dealt round-robin)."""
    shapes = split_shape(shape, parts)
    workload = replace(workload, output=None)  # a tokenizer stays in the parent, which measures
    return [
        Part(
            workload,
            shapes[i],
            tuple(numbers[i::parts]) if numbers is not None else None,
            first + i,
            parts,
            tuple(warmup[i::parts]),
        )
        for i in range(parts)
    ]


def _worker(
    part: Part, slot: int, ready: Any, go: Any, start_at: Any, finished: Any, results: Any
) -> None:
    try:
        driven = run_async(_drive_part(part, slot, ready, go, start_at, finished))
        results.put((slot, driven, None))
    except Exception as exc:  # any failure: the parent reports it as one line
        results.put((slot, None, f"{type(exc).__name__}: {exc}"))


async def _drive_part(
    part: Part, slot: int, ready: Any, go: Any, start_at: Any, finished: Any
) -> tuple[Driven, Driven]:
    """(the measured requests, the warm-up) of one part."""
    import asyncio

    cfg = part.workload.config
    client = Client(Endpoint.parse(cfg.url), cfg.timeout_s)
    payload = part.workload.payload_fn()
    warmed = Driven((), LoopHealth(lag_s=dist([]), cpu_fraction=0.0))
    try:
        if part.warmup:
            warm = Shape(max(1, part.shape.concurrency or 1), requests=len(part.warmup))
            warmed = await drive(client, payload, iter(part.warmup), warm)
        indices: Iterator[int] = itertools.count(part.first, part.step)
        send: Callable[[int], bytes] = payload
        if part.numbers is not None:
            built = {i: payload(i) for i in part.numbers}
            indices, send = iter(part.numbers), built.__getitem__
        ready.put(slot)
        await asyncio.get_running_loop().run_in_executor(None, go.wait)

        def tick(done: list[RawRequest], elapsed: float) -> None:
            finished[slot] = len(done)

        driven = await drive(client, send, indices, part.shape, tick, start_at=start_at.value)
        return driven, warmed
    finally:
        client.close()


def drive_processes(
    parts: list[Part], on_tick: Callable[[int, float], None]
) -> tuple[Driven, Driven]:
    """Start one process per part, start them together, merge what they recorded: (the
    measured requests, the warm-up requests)."""
    ctx = mp.get_context("spawn")  # no forked copy of the parent's loop or threads
    ready, results = ctx.Queue(), ctx.Queue()
    go, start_at, finished = ctx.Event(), ctx.Value("d", 0.0), ctx.Array("i", len(parts))
    procs = [
        ctx.Process(
            target=_worker, args=(p, i, ready, go, start_at, finished, results), daemon=True
        )
        for i, p in enumerate(parts)
    ]
    for proc in procs:
        proc.start()
    got: dict[int, tuple[Driven, Driven]] = {}
    try:
        _await_ready(ready, results, procs)
        start_at.value = time.perf_counter() + _START_MARGIN_S
        go.set()
        while len(got) < len(parts):
            _collect(results, got, procs)
            on_tick(sum(finished[:]), time.perf_counter() - start_at.value)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
    return (merge([got[i][0] for i in range(len(parts))]),
            merge([got[i][1] for i in range(len(parts))]))


def _await_ready(ready: Any, results: Any, procs: list[Any]) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    waiting = len(procs)
    while waiting:
        try:
            ready.get(timeout=0.5)
            waiting -= 1
        except queue.Empty:
            _check(results, procs)
            if time.monotonic() > deadline:
                raise LoadgenError("loadgen worker processes did not get ready in time") from None


def _collect(results: Any, got: dict[int, tuple[Driven, Driven]], procs: list[Any]) -> None:
    try:
        slot, driven, error = results.get(timeout=0.5)
    except queue.Empty:
        if any(not p.is_alive() and p.exitcode for p in procs):
            raise LoadgenError("a loadgen worker process died; run with --processes 1") from None
        return
    if error:
        raise LoadgenError(f"loadgen worker {slot} failed: {error}")
    got[slot] = driven


def _check(results: Any, procs: list[Any]) -> None:
    try:
        slot, _, error = results.get_nowait()
    except queue.Empty:
        if any(not p.is_alive() for p in procs):
            raise LoadgenError("a loadgen worker process died while preparing") from None
        return
    raise LoadgenError(f"loadgen worker {slot} failed: {error}")


def merge(parts: Sequence[Driven]) -> Driven:
    """Pure: one Driven from several loops on the same clock; CPU is the busiest loop's."""
    raws = tuple(sorted((r for d in parts for r in d.raws), key=lambda r: r.index))
    lags = tuple(lag for d in parts for lag in d.lags)
    busiest = max((d.loop.cpu_fraction for d in parts), default=0.0)
    return Driven(raws, LoopHealth(lag_s=dist(lags), cpu_fraction=busiest), lags)
