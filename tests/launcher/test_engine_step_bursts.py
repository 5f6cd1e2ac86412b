"""The served engine's step is read only from tokens that came paced (issue 22): on a loaded
machine vLLM's server held a stream's token events back and wrote the whole generation at once
(33 events within 0.3 ms, each in its own write, one token each), and the probe read a decode
step of 0.01 ms ("step 0.0 ms" in test_agent_cpu). Here a stand-in server on a real loopback
socket does the same to some streams; no engine is started. What it cannot hold back is read
instead: a one-token request's first token and a stream's end.

The probe reads the stand-in's own clock (:class:`StandinClock`), not the host's: the stand-in's
waits move it, and it writes an event only once the probe has stamped the one before, so each
event is stamped with the time the stand-in wrote it at however long this host holds the probe
or the stand-in up. On the host's clock a loaded machine made these readings flaky: it spaced a
held-back burst's events, split it, or held one stream 8 ms longer than another (a generation
sent at once then read as 16 steps of 0.5 ms, from its end)."""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.model.tinymodel import ensure_tiny_model
from launcher.pipeline import enginesteps
from launcher.probe import enginestep
from launcher.probe.enginestep import BURST_GAP_S, EngineStepError, Streamed
from tests.support.postserver import PostServer

STEP_S = 0.004  # the stand-in's decode step
TTFT_S = 0.02  # and its time to first token
TOKENS = 17  # a timed stream's: 16 steps


class StandinClock:
    """The stand-in's time, which the probe reads in place of ``time.perf_counter``
    (:func:`on_standin_clock`): it moves only where the stand-in waits (a time to first token, a
    decode step), never while the machine holds a thread up. Every reading is one piece of a
    body the probe stamped (or a request's send), and the stand-in, having written a piece,
    waits until the probe has read the clock for it (:meth:`stamped`) before it moves the clock
    on: a piece is stamped with the time it was written at, and no two writes merge."""

    def __init__(self) -> None:
        self._now = 0.0
        self._reads = 0
        self._changed = threading.Condition()

    def perf_counter(self) -> float:
        with self._changed:
            self._reads += 1
            self._changed.notify_all()
            return self._now

    def reads(self) -> int:
        with self._changed:
            return self._reads

    def sleep(self, seconds: float) -> None:
        with self._changed:
            self._now += seconds

    def stamped(self, reads: int) -> None:
        """Wait until the probe has read the clock ``reads`` times in all."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._reads >= reads, timeout=60):
                raise TimeoutError(f"the probe read the clock {self._reads} times, not {reads}")


def on_standin_clock(monkeypatch: pytest.MonkeyPatch) -> StandinClock:
    """A clock for a stand-in, which the probe's stamps read from now on (the rest of the
    ``time`` module as it is)."""
    clock = StandinClock()
    fake = SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    fake.perf_counter = clock.perf_counter
    monkeypatch.setattr(enginestep, "time", fake)
    return clock


class Standin(PostServer):
    """A vLLM-like completions server that streams ``max_tokens`` token events, one every
    STEP_S after TTFT_S, except the streams of more than one token that ``hold`` picks by
    their count (1, 2, ...): "held" ones it holds until the whole generation is made, then
    writes every event at once, each in its own write, as vLLM's server did on the loaded
    machine; "instant" ones it writes at once right after TTFT_S (a generation no decode
    makes that fast; in one write). It waits on ``clock`` and stamps nothing itself."""

    def __init__(self, hold: Any, clock: StandinClock) -> None:
        self.hold = hold
        self.clock = clock
        self.long_streams = itertools.count(1)
        super().__init__(lambda handler, body: self.stream(handler, int(body["max_tokens"])))

    def stream(self, handler: BaseHTTPRequestHandler, tokens: int) -> None:
        # each write leaves at once, as uvicorn's (TCP_NODELAY): the bursts are the server's
        handler.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        reads = self.clock.reads()  # the probe has read the clock as it sent this request

        def write(data: bytes) -> None:  # one piece, stamped before the clock moves on
            nonlocal reads
            handler.wfile.write(data)
            reads += 1
            self.clock.stamped(reads)

        held = self.hold(next(self.long_streams)) if tokens > 1 else None
        events: list[dict[str, Any]] = [
            {"choices": [{"index": 0, "text": f" t{i}"}], "usage": None} for i in range(tokens)]
        events.append({"choices": [], "usage": {"prompt_tokens": 16,
                                                "completion_tokens": tokens}})
        self.clock.sleep(TTFT_S + (tokens - 1) * STEP_S if held == "held" else TTFT_S)
        if held == "instant":
            write(b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
                  + b"data: [DONE]\n\n")
            return
        for i, event in enumerate(events):
            if not held and 0 < i < tokens:
                self.clock.sleep(STEP_S)
            write(b"data: " + json.dumps(event).encode() + b"\n\n")
        write(b"data: [DONE]\n\n")


@pytest.fixture
def every_other_held(monkeypatch: pytest.MonkeyPatch) -> Iterator[Standin]:
    server = Standin(lambda n: "held" if n % 2 == 0 else None, on_standin_clock(monkeypatch))
    yield server
    server.close()


def timed(server: Standin, rounds: int = 3) -> enginestep.Timed:
    served = enginestep.Served(server.url, "standin")
    return enginestep.time_served(served, 1000, rounds=rounds, steps=TOKENS - 1, depth=0,
                                  batch=0)


def test_a_stream_the_server_held_back_has_its_step_read_from_its_end_never_as_zero(
    every_other_held: Standin,
) -> None:
    """Every other decode stream comes at once after its whole generation (read as it came:
    a step of ~0 and a first token a whole decode late): its step is read from its end less a
    one-token request's first token, and said; every first token is a one-token request's.
    The warm-up streams are the stand-in's first two, the rounds' decodes its 3rd to 5th."""
    got = timed(every_other_held)
    # on the stand-in's clock every reading is exact: the paced rounds' steps as they came, the
    # held-back one's from its end, each first token the one-token request's
    assert got.steps_s == pytest.approx((STEP_S,) * 3), got
    assert got.long_ttft_s == pytest.approx((TTFT_S,) * 3), got
    # the held-back round alone is said, its whole generation in one burst
    assert len(got.unread_rounds) == 1, got.unread_rounds
    why = got.unread_rounds[0]
    assert why.startswith("round 2: the decode's step read from its end: "), why
    assert why.endswith("held back, then sent at once)"), why
    assert f"in one burst with {TOKENS - 1} more of its {TOKENS} tokens" in why, why
    assert all("\n" not in why and len(why) <= 200 for why in got.unread_rounds)


def test_a_generation_sent_faster_than_any_decode_is_no_step_and_none_kept_is_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    server = Standin(lambda n: "instant", on_standin_clock(monkeypatch))
    try:
        with pytest.raises(EngineStepError) as err:
            timed(server, rounds=2)
    finally:
        server.close()
    message = str(err.value)
    assert "\n" not in message
    assert "no timed round could be read, 4 run" in message, message
    assert "not from its end either" in message, message


def test_probe_measures_line_and_record_say_which_rounds_were_not_read_as_they_came(
    every_other_held: Standin, tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(ensure_tiny_model().parent)
    env = {"TOPOSERVE_CACHE": str(cache), "PATH": "/usr/bin:/bin"}
    served = enginestep.Served(every_other_held.url, "standin")
    line = enginesteps.measure(env, served, depth=0, batch=0)
    rec = enginestep.load(cache, enginesteps.key_here(env))
    assert rec is not None, line
    assert rec.unread_rounds, line
    assert all("held back" in why for why in rec.unread_rounds), rec.unread_rounds
    assert (f"{len(rec.unread_rounds)} round(s) not read as they came (round 2: the decode's "
            "step read from its end") in line, line
    # the rounds' decodes are the stand-in's 3rd to 9th long streams: the 4th, 6th and 8th held
    assert len(rec.unread_rounds) == 3, rec.unread_rounds
    assert rec.step_s == pytest.approx(STEP_S), rec


def burst(first: float, tokens: int, gap: float = 10e-6) -> Streamed:
    """A stream of ``tokens`` events that all arrived from ``first`` on, ``gap`` apart."""
    return Streamed(0.0, tuple(first + i * gap for i in range(tokens)), tokens)


def test_a_stream_is_read_only_where_its_first_token_came_alone_and_its_step_is_a_step() -> None:
    paced = Streamed(0.0, tuple(0.02 + i * 0.006 for i in range(33)), 33)
    assert paced.unread() is None
    assert paced.step_s == pytest.approx(0.006)
    # the client held up mid-stream: what came meanwhile arrives at once, both ends on time
    stalled = replace(paced, token_times=tuple(0.1 if 0.05 < t < 0.1 else t
                                               for t in paced.token_times))
    assert stalled.unread() is None
    assert stalled.step_s == pytest.approx(0.006)
    whole = burst(0.24, 33)  # the whole generation at once, 0.2 s after its first token was made
    assert whole.held == 32
    assert "first token came in one burst with 32 more of its 33 tokens" in (whole.unread() or "")
    # read as before, it is the "step 0.0 ms" the issue saw
    assert (whole.step_s or 0.0) < BURST_GAP_S
    # a first token that came alone, late, the rest right after it: a step no decode makes
    alone = Streamed(0.0, (0.2, *(0.201 + i * 10e-6 for i in range(32))), 33)
    assert alone.held == 0
    assert "a step no decode makes" in (alone.unread() or "")
    # two tokens only, together: the first came a step late
    assert burst(0.02, 2).unread() is not None
    assert Streamed(0.0, (0.02,), 1).unread() is not None


def test_streams_held_back_at_many_are_left_out_and_too_many_give_no_step() -> None:
    paced = [Streamed(0.0, tuple(0.02 + 0.001 * k + i * 0.008 for i in range(33)), 33)
             for k in range(16)]
    assert enginestep.batch_step(paced) == pytest.approx(0.008)
    some = [*paced[:12], *(burst(0.3, 33) for _ in range(4))]
    assert enginestep.batch_step(some) == pytest.approx(0.008)
    most = [*paced[:4], *(burst(0.3, 33) for _ in range(12))]
    assert enginestep.batch_step(most) is None
    assert "12 of 16 streams unread" in (enginestep.batch_why(most) or "")


def test_a_saved_step_no_decode_makes_is_refused_and_the_unread_rounds_survive_json() -> None:
    key = enginestep.StepKey("cpu: test CPU (2 threads)", "0.32.0", "2.13.0+cpu")
    rec = enginestep.EngineStep(key, 0.005, (0.005, 0.006), 4_000_000, 8_000_000,
                                "2026-12-03T08:00:00", 0.01, 5e-5, model_token_params=3_000_000,
                                model_head_params=500_000,
                                unread_rounds=("round 2: the decode's step read from its end",))
    saved = json.loads(json.dumps(enginestep.to_json(rec)))
    assert enginestep.from_json(saved) == rec
    # what the probe kept before (format 6): a step read from a burst, max(1e-6, ~0)
    six = {**saved, "version": 6, "step_s": 1e-6, "steps_s": [1e-6, 1e-6, 0.0042]}
    six.pop("unread_rounds")
    with pytest.raises(EngineStepError, match="no decode step"):
        enginestep.from_json(six)
    assert enginestep.from_json({**six, "step_s": 0.0042, "steps_s": [0.0042]}).unread_rounds == ()
