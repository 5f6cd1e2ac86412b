"""The served engine's step is read only from tokens that came paced (issue 22): on a loaded
machine vLLM's server held a stream's token events back and wrote the whole generation at once
(33 events within 0.3 ms, each in its own write, one token each), and the probe read a decode
step of 0.01 ms ("step 0.0 ms" in test_agent_cpu). Here a stand-in server on a real loopback
socket does the same to some streams; no engine is started. What it cannot hold back is read
instead: a one-token request's first token and a stream's end."""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from launcher.model.tinymodel import ensure_tiny_model
from launcher.pipeline import enginesteps
from launcher.probe import enginestep
from launcher.probe.enginestep import BURST_GAP_S, EngineStepError, Streamed

STEP_S = 0.004  # the stand-in's decode step
TTFT_S = 0.02  # and its time to first token
TOKENS = 17  # a timed stream's: 16 steps


class Standin:
    """A vLLM-like completions server that streams ``max_tokens`` token events, one every
    STEP_S after TTFT_S, except the streams of more than one token that ``hold`` picks by
    their count (1, 2, ...): "held" ones it holds until the whole generation is made, then
    writes every event at once, each in its own write, as vLLM's server did on the loaded
    machine; "instant" ones it writes at once right after TTFT_S (a generation no decode
    makes that fast; in one write, so that no preemption of the server spaces its events)."""

    def __init__(self, hold: Any) -> None:
        self.hold = hold
        self.long_streams = itertools.count(1)
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                standin.stream(self, int(body["max_tokens"]))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stream(self, handler: BaseHTTPRequestHandler, tokens: int) -> None:
        # each write leaves at once, as uvicorn's (TCP_NODELAY): the bursts are the server's
        handler.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        held = self.hold(next(self.long_streams)) if tokens > 1 else None
        events = [{"choices": [{"index": 0, "text": f" t{i}"}], "usage": None}
                  for i in range(tokens)]
        events.append({"choices": [], "usage": {"prompt_tokens": 16,
                                                "completion_tokens": tokens}})
        time.sleep(TTFT_S + (tokens - 1) * STEP_S if held == "held" else TTFT_S)
        if held == "instant":  # one write: no preemption of this thread can space its events
            handler.wfile.write(b"".join(b"data: " + json.dumps(e).encode() + b"\n\n"
                                         for e in events) + b"data: [DONE]\n\n")
            return
        for i, event in enumerate(events):
            if not held and 0 < i < tokens:
                time.sleep(STEP_S)
            handler.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        handler.wfile.write(b"data: [DONE]\n\n")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def every_other_held() -> Iterator[Standin]:
    server = Standin(hold=lambda n: "held" if n % 2 == 0 else None)
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
    assert len(got.steps_s) == 3, got
    assert all(0.8 * STEP_S < s < 10 * STEP_S for s in got.steps_s), got.steps_s
    assert all(TTFT_S <= t < TTFT_S + 5 * STEP_S for t in got.long_ttft_s), got.long_ttft_s
    assert got.unread_rounds, got
    # a loaded host may space the held-back burst's first two events past BURST_GAP_S: then
    # the stream reads as a first token alone and a step no decode makes; both readings say
    # the generation was held back, and either keeps the decode off the stream's own step
    # and a loaded host may delay a paced stream's events into a burst too (a clean clone read
    # round 1's first token with 1 more): the held-back round must be among those said
    why = next((w for w in got.unread_rounds
                if w.startswith("round 2: the decode's step read from its end: ")), "")
    assert why, got.unread_rounds
    assert why.endswith("held back, then sent at once)"), why
    # a loaded host may also split the burst: any held count, of the whole generation
    assert (re.search(rf"in one burst with \d+ more of its {TOKENS} tokens", why)
            or f"its {TOKENS} tokens came within " in why), why
    assert all("\n" not in why and len(why) <= 200 for why in got.unread_rounds)


def test_a_generation_sent_faster_than_any_decode_is_no_step_and_none_kept_is_one_line() -> None:
    server = Standin(hold=lambda n: "instant")
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
    assert 0.5 * STEP_S < rec.step_s < 10 * STEP_S, rec


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
