"""Open-loop sends leave at their scheduled time, never before it."""

from __future__ import annotations

import asyncio
import time

import pytest

from loadgen.runner import run_async, sleep_until


def test_sleep_until_never_returns_before_the_deadline() -> None:
    async def early_returns() -> list[float]:
        early = []
        for i in range(200):
            deadline = time.perf_counter() + (i % 7) * 0.0007
            await sleep_until(deadline)
            now = time.perf_counter()
            if now < deadline:
                early.append(deadline - now)
        return early

    assert run_async(early_returns()) == []


def test_sleep_until_a_past_deadline_returns_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(delay: float) -> None:
        slept.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)
    asyncio.run(sleep_until(time.perf_counter() - 1.0))
    assert slept == []  # not even a yield: the deadline had passed
