"""The request loop: sends prepared requests in a load shape and keeps raw timestamps only.

Closed loop: `concurrency` workers, each sending its next request when the previous one ends.
Open loop: requests leave at scheduled times whatever the server does (optionally capped at
`concurrency` in flight); the delay between the scheduled and the real send is kept, so that
coordinated omission shows instead of hiding.

Alongside runs a probe of the loop itself: a 10 ms timer whose lateness is the loop lag that
every timestamp may carry, and the process CPU time, which says whether loadgen was the limit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from loadgen.schedule import arrival_offsets
from loadgen.stats import LoopHealth, dist
from loadgen.timing import RawRequest
from loadgen.transport import Client

T = TypeVar("T")
_PROBE_S = 0.010
_TICK_S = 0.5


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when it is installed (less loop overhead per token), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Shape:
    concurrency: int | None  # closed loop: workers; open loop: cap on in-flight (None = no cap)
    rate: float | None = None  # open loop when set, requests/s
    arrivals: str = "poisson"
    requests: int | None = None
    duration: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class Driven:
    raws: tuple[RawRequest, ...]
    loop: LoopHealth
    lags: tuple[float, ...] = ()  # the probe's raw samples, so several loops can be merged


Tick = Callable[[list[RawRequest], float], None]  # (finished so far, elapsed s) -> None
Load = Callable[[list[RawRequest], float], Awaitable[None]]  # (finished, start) -> sends


class _LoopProbe:
    def __init__(self) -> None:
        self.lags: list[float] = []
        self._stop = False

    async def run(self) -> None:
        while not self._stop:
            start = time.perf_counter()
            await asyncio.sleep(_PROBE_S)
            self.lags.append(max(0.0, time.perf_counter() - start - _PROBE_S))

    def stop(self) -> None:
        self._stop = True


async def drive(
    client: Client,
    payload: Callable[[int], bytes],
    indices: Iterator[int],
    shape: Shape,
    tick: Tick | None = None,
    start_at: float | None = None,
) -> Driven:
    """Run one load shape; `indices` yields the request numbers to send (prompts differ by it).

    `start_at` (a perf_counter time) lets several processes begin together.
    """
    if start_at is not None:
        await asyncio.sleep(max(0.0, start_at - time.perf_counter()))

    async def load(done: list[RawRequest], wall0: float) -> None:
        if shape.rate is None:
            await _closed_loop(client, payload, indices, shape, done)
        else:
            await _open_loop(client, payload, indices, shape, done)

    return await _probed(load, tick)


async def drive_sessions(
    client: Client,
    payloads: Sequence[Sequence[bytes]],
    think_s: float,
    first_index: Callable[[int], int],
    tick: Tick | None = None,
) -> Driven:
    """Agent sessions: session i sends its turns in order, `think_s` apart, starting
    i/len(payloads) of a think time late; request numbers are first_index(i) + turn."""

    async def load(done: list[RawRequest], wall0: float) -> None:
        async def session(i: int, turns: Sequence[bytes]) -> None:
            await sleep_until(wall0 + think_s * i / len(payloads))
            for t, payload in enumerate(turns):
                if t:  # the agent reads the answer and runs its tool: never shorter than asked
                    await sleep_until(time.perf_counter() + think_s)
                done.append(await client.send(first_index(i) + t, payload))

        await asyncio.gather(*(session(i, turns) for i, turns in enumerate(payloads)))

    return await _probed(load, tick)


async def _probed(load: Load, tick: Tick | None) -> Driven:
    """Run ``load`` (given the list it appends finished requests to, and its start time) with
    the loop probe and the ticker beside it; the requests in index order and the loop's health.
    """
    done: list[RawRequest] = []
    probe = _LoopProbe()
    probe_task = asyncio.create_task(probe.run())
    ticker = asyncio.create_task(_ticker(tick, done)) if tick else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await load(done, wall0)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    probe.stop()
    for task in (probe_task, ticker):
        if task is not None:
            task.cancel()
    if tick:
        tick(done, wall)
    health = LoopHealth(lag_s=dist(probe.lags), cpu_fraction=cpu / wall if wall > 0 else 0.0)
    return Driven(tuple(sorted(done, key=lambda r: r.index)), health, tuple(probe.lags))


async def _ticker(tick: Tick, done: list[RawRequest]) -> None:
    start = time.perf_counter()
    while True:
        await asyncio.sleep(_TICK_S)
        tick(done, time.perf_counter() - start)


def _budget(shape: Shape) -> Callable[[], bool]:
    """True while another request may start (count is limited by `indices` itself)."""
    if shape.duration is None:
        return lambda: True
    end = time.perf_counter() + shape.duration
    return lambda: time.perf_counter() < end


async def _closed_loop(
    client: Client,
    payload: Callable[[int], bytes],
    indices: Iterator[int],
    shape: Shape,
    done: list[RawRequest],
) -> None:
    more = _budget(shape)

    async def worker() -> None:
        for index in indices:
            if not more():
                return
            done.append(await client.send(index, payload(index)))

    await asyncio.gather(*(worker() for _ in range(shape.concurrency or 1)))


async def _open_loop(
    client: Client,
    payload: Callable[[int], bytes],
    indices: Iterator[int],
    shape: Shape,
    done: list[RawRequest],
) -> None:
    assert shape.rate is not None
    slots = asyncio.Semaphore(shape.concurrency) if shape.concurrency else None
    tasks: set[asyncio.Task[None]] = set()

    async def one(index: int, scheduled: float) -> None:
        try:
            done.append(await client.send(index, payload(index), scheduled=scheduled))
        finally:
            if slots:
                slots.release()

    offsets = arrival_offsets(shape.rate, shape.arrivals, shape.seed, duration=shape.duration)
    start = time.perf_counter()
    for index, offset in zip(indices, offsets, strict=False):
        scheduled = start + offset
        await sleep_until(scheduled)
        if slots:
            await slots.acquire()
        task = asyncio.create_task(one(index, scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)


async def sleep_until(deadline: float) -> None:
    """Return at ``deadline`` (perf_counter), never before it. The loop's timers (uvloop's have
    millisecond resolution) can fire early, which would send an open-loop request ahead of its
    schedule and report a negative lag; the last stretch is yielded away instead of slept."""
    while (left := deadline - time.perf_counter()) > 0:  # noqa: ASYNC110 - a deadline, no event
        await asyncio.sleep(left if left > 0.002 else 0)


def window(raws: tuple[RawRequest, ...]) -> tuple[float, float] | None:
    """(first send, last end) of a run: the wall time aggregate throughput is over."""
    if not raws:
        return None
    return min(r.sent for r in raws), max(r.done for r in raws)
