"""The load simulation (:func:`schedsim.simulate`) and the agent plan's sessions
(:func:`schedsim.simulate_sessions`) run vLLM's engine core by one code path
(``schedsim._EngineCore``): when the next step is chosen, each step run and its outputs handed
over in the launch order, the engine going idle. What one of them models, the other does: the
same sends give the same timeline in both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from launcher.planner import schedsim
from launcher.planner.schedsim import (
    IdleStartTimer,
    SchedulerLimits,
    Turn,
    Workload,
    simulate,
    simulate_sessions,
)
from tests.launcher.test_schedsim_launch import (
    ASYNC,
    DECODE_S,
    PREFILL_S,
    SYNC,
    Launching,
    Steps,
)

# two requests of 16 tokens, 3 generated, sent 0.05 s apart: two sessions staggered over a
# think time of 0.1 s send their first turn so (session i at 0.1 x i / 2)
SENDS = (0.0, 0.05)
THINK_S = 0.1
IDLE_S = 0.004


@dataclass(frozen=True)
class IdleStarting(Launching):
    """The same steps and launches, on an engine core whose own work a step (IDLE_S) async
    scheduling hides behind the step before: an idle engine's first step pays it first."""

    def idle_start_s(self) -> float:
        return IDLE_S


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
@pytest.mark.parametrize("timer", [Steps(), Launching(0.03), Launching(PREFILL_S),
                                   IdleStarting(0.03)],
                         ids=["no-launch", "short-launch", "long-launch", "idle-start"])
def test_the_same_sends_give_the_same_timeline_as_requests_and_as_sessions(
        lim: SchedulerLimits, timer: Steps) -> None:
    assert as_sessions(lim, timer) == pytest.approx(as_requests(lim, timer))


def test_a_sessions_turn_on_an_idle_engine_pays_the_engine_cores_own_work_first() -> None:
    # one session, a turn a second after its answer: each turn finds the engine idle, and its
    # first step begins once the engine core has scheduled and prepared it; the decode steps
    # after it are prepared while the step before runs
    assert isinstance(IdleStarting(0.0), IdleStartTimer)
    res = simulate_sessions(ASYNC, IdleStarting(0.0), (Turn(16, 3), Turn(40, 3)), 1,
                            think_s=1.0)
    for (turn,) in res.turns:
        assert turn.ttft_s == pytest.approx(IDLE_S + PREFILL_S)
        assert turn.finished_s - turn.first_token_s == pytest.approx(2 * DECODE_S)
    # without async scheduling that work is in every step's time already: nothing added
    sync = simulate_sessions(SYNC, IdleStarting(0.0), (Turn(16, 3), Turn(40, 3)), 1,
                             think_s=1.0)
    assert [t.ttft_s for (t,) in sync.turns] == pytest.approx([PREFILL_S, PREFILL_S])
