"""Bounded admission: at most ``limit`` requests in flight, then a bounded FIFO queue with a wait
limit, then refusal (429 with Retry-After) — so a burst queues briefly instead of piling up."""

from __future__ import annotations

import asyncio
from collections import deque


class Admission:
    def __init__(self, limit: int, queue: int, wait_s: float) -> None:
        self.limit = limit
        self.queue = queue
        self.wait_s = wait_s
        self.in_flight = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self.waiters)

    async def acquire(self) -> bool:
        """True once the request may go on; False when it must be refused."""
        if self.in_flight < self.limit and not self.waiters:
            self.in_flight += 1
            return True
        if len(self.waiters) >= self.queue:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.wait_s)
            return True
        except TimeoutError:
            if fut.done():  # the slot arrived just as the wait ran out: keep it
                return True
            fut.cancel()
            return False
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a slot while being cancelled: give it on
            fut.cancel()
            raise
        finally:
            if fut in self.waiters:
                self.waiters.remove(fut)

    def release(self) -> None:
        """Give the slot to the oldest waiter still waiting, else free it."""
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.in_flight -= 1
