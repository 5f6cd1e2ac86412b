"""An asyncio event loop on a virtual clock, for timing behaviour asserted exactly.

Time stands still while anything is ready (I/O on loopback, callbacks) and, when nothing is,
jumps straight to the next timer. So an engine that writes token k at ``t0 + ttft + k * itl``
is seen to write it at exactly that instant, however loaded the machine is: the test asserts
what the code schedules, not how fast this machine runs it (that is for benchmarks/).
``stall(seconds)`` moves the clock on inside a callback, as a process paused by the OS would.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

# Bytes written to a loopback socket are readable at once; this little real time is granted
# before concluding that nothing is in flight and moving the clock on.
_SETTLE_S = 0.005


class _JumpingSelector(selectors.BaseSelector):
    def __init__(self, loop: VirtualClockLoop) -> None:
        self.inner = selectors.DefaultSelector()
        self.loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self.inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.inner.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self.inner.get_map()

    def close(self) -> None:
        self.inner.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self.inner.select(0) or self.inner.select(_SETTLE_S)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only I/O can move things on
            return self.inner.select(None)
        self.loop.now += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = 1000.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now

    def stall(self, seconds: float) -> None:
        self.now += seconds


def run(coro: Any) -> Any:
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
