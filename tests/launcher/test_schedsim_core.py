"""The load simulation (:func:`schedsim.simulate`) and the agent plan's sessions
(:func:`schedsim.simulate_sessions`) run vLLM's engine core by one code path
(``schedsim._EngineCore``): when the next step is chosen, each step run and its outputs handed
over in the launch order, the engine going idle. What one of them models, the other does: the
same sends give the same timeline in both."""

from __future__ import annotations

from typing import Any

import pytest

from launcher.planner import schedsim
from launcher.planner.schedsim import (
    SchedulerLimits,
    Turn,
    Workload,
    simulate,
    simulate_sessions,
)
from tests.launcher.test_schedsim_launch import ASYNC, PREFILL_S, SYNC, Launching, Steps

# two requests of 16 tokens, 3 generated, sent 0.05 s apart: two sessions staggered over a
# think time of 0.1 s send their first turn so (session i at 0.1 x i / 2)
SENDS = (0.0, 0.05)
THINK_S = 0.1


def as_requests(lim: SchedulerLimits, timer: Steps) -> list[float]:
    res = simulate(lim, timer, Workload(16, 3, arrivals=SENDS))
    return [t for r in sorted(res.requests, key=lambda r: r.sent_s)
            for t in (r.first_token_s, r.finished_s)]


def as_sessions(lim: SchedulerLimits, timer: Steps) -> list[float]:
    res = simulate_sessions(lim, timer, (Turn(16, 3),), 2, think_s=THINK_S)
    assert [r.sent_s for r in res.turns[0]] == pytest.approx(SENDS)
    return [t for r in res.turns[0] for t in (r.first_token_s, r.finished_s)]


def test_simulate_and_simulate_sessions_run_each_step_through_one_engine_core(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    real = schedsim._EngineCore.run

    def spy(self: Any, *args: Any) -> Any:
        ran.append(caller)
        return real(self, *args)

    monkeypatch.setattr(schedsim._EngineCore, "run", spy)
    caller = "simulate"
    simulate(ASYNC, Launching(PREFILL_S), Workload(16, 3, arrivals=SENDS))
    caller = "sessions"
    simulate_sessions(ASYNC, Launching(PREFILL_S), (Turn(16, 3),), 2, think_s=THINK_S)
    assert ran.count("simulate") >= 2
    assert ran.count("sessions") == ran.count("simulate")


@pytest.mark.parametrize("lim", [SYNC, ASYNC], ids=["sync", "async"])
@pytest.mark.parametrize("timer", [Steps(), Launching(0.03), Launching(PREFILL_S)],
                         ids=["no-launch", "short-launch", "long-launch"])
def test_the_same_sends_give_the_same_timeline_as_requests_and_as_sessions(
        lim: SchedulerLimits, timer: Steps) -> None:
    assert as_sessions(lim, timer) == pytest.approx(as_requests(lim, timer))
