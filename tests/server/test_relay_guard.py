"""The relay's guard decides whom a timeout blames: the engine only while the client reads.

A client whose socket is paused holds the engine back (the proxy stops reading it), so the
silence the idle timer sees is the client's. Driven with short real timeouts on a bare loop;
what is asserted is the reason recorded, never how long it took.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from server.config import ProxyConfig
from server.relay import _Guard

CFG = ProxyConfig(upstreams=("http://127.0.0.1:1",), first_byte_timeout_s=0.05,
                  idle_timeout_s=0.05, client_stall_timeout_s=0.1)


async def _reason(client_paused: Callable[[], bool], streaming: bool,
                  during: Callable[[_Guard], None] | None = None) -> str | None:
    task = asyncio.create_task(asyncio.sleep(30))
    guard = _Guard(task, CFG, client_paused)
    if streaming:
        guard.touch()
    if during is not None:
        during(guard)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    guard.stop()
    return guard.reason


def test_an_engine_silent_to_a_reading_client_is_an_idle_timeout() -> None:
    assert asyncio.run(_reason(lambda: False, streaming=True)) == "idle"


def test_an_engine_that_never_answers_is_a_first_byte_timeout() -> None:
    assert asyncio.run(_reason(lambda: False, streaming=False)) == "first_byte"


def test_a_client_paused_throughout_is_a_stall_not_an_engine_timeout() -> None:
    # Under a server without a stall timer of its own (no one cuts the client off first).
    assert asyncio.run(_reason(lambda: True, streaming=True)) == "stall"
    assert asyncio.run(_reason(lambda: True, streaming=False)) == "stall"


def test_a_client_that_reads_again_leaves_a_silent_engine_to_blame() -> None:
    paused = [True]
    seen: list[bool] = []

    def watch(guard: _Guard) -> None:
        loop = asyncio.get_running_loop()

        def resume() -> None:  # after the first expiry put the timeout off for the client
            seen.append(guard.held)
            paused[0] = False
            guard.touch()  # the client took the backlog: data flowed once more

        loop.call_later(0.08, resume)

    assert asyncio.run(_reason(lambda: paused[0], streaming=True, during=watch)) == "idle"
    assert seen == [True]
