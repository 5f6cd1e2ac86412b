"""`launcher serve`'s first run on a machine without GPUs: it times the CPU engine it has just
started (the embedded model, no timing kept here), keeps the record and prints the calibrated
plan beside the assumed one; any failure of that is one line and the serve goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from launcher.cli.main import build_parser
from launcher.engine.serve import SignalGuard, StopCut
from launcher.engine.supervise import free_port, http_ok
from launcher.pipeline import enginesteps
from launcher.planner.costmodel import Prediction
from launcher.probe import enginestep
from launcher.probe.enginestep import EngineStep, Served
from tests.support.cache import fresh_cache
from tests.support.standin import STANDIN, engines_alive, stop_once_held

REPO = Path(__file__).resolve().parents[2]
SERVED = Served("http://127.0.0.1:1", "toposerve-tiny", {"Authorization": "Bearer k"})
ASSUMED = Prediction(3375.0, 294.5, 300.0, 0.15, 1.0, 1)
TIMED = Prediction(15800.0, 451.2, 900.0, 0.03, 0.6, 1)


def kept(env: dict[str, str], step_s: float = 0.002) -> EngineStep:
    rec = EngineStep(enginesteps.key_here(env), step_s, (step_s, step_s * 1.1), 4_000_000,
                     8_000_000, "2026-12-05T01:00:00", model_token_params=3_000_000,
                     model_head_params=500_000)
    assert enginestep.save(Path(env["TOPOSERVE_CACHE"]), rec) is not None
    return rec


def decide(env: dict[str, str], **changed: object) -> str | None:
    asked: dict[str, object] = {"engine": "cpu", "single": True, "default_model": True,
                                "planned_here": True, "calibrate": True, **changed}
    return enginesteps.first_serve(env, **asked)  # type: ignore[arg-type]


def test_only_the_embedded_model_on_the_cpu_engine_without_a_kept_timing_is_timed(
        tmp_path: Path) -> None:
    env = {"TOPOSERVE_CACHE": str(tmp_path)}
    assert decide(env) == enginesteps.TIME
    assert decide(env, default_model=False) == enginesteps.HINT
    for changed in ({"calibrate": False}, {"engine": "gpu"}, {"single": False},
                    {"planned_here": False}):
        assert decide(env, **changed) is None, changed
    kept(env)  # the record `attach` reads for this machine: nothing more to time or say
    assert decide(env) is None
    assert decide(env, default_model=False) is None


def test_a_timing_that_kept_its_record_prints_the_replanned_figures_beside_the_assumed(
        tmp_path: Path) -> None:
    env = {"TOPOSERVE_CACHE": str(tmp_path)}
    seen: list[Served] = []

    def timer(e: object, served: Served) -> str:
        seen.append(served)
        kept(env)
        return "timed"

    ticks = iter([100.0, 127.4])
    done = enginesteps.calibrate_served(env, SERVED, ASSUMED, lambda: TIMED, timer=timer,
                                        clock=lambda: next(ticks))
    assert seen == [SERVED]
    assert done.ok
    assert done.line == ("timed this machine's CPU engine once (27 s, kept for later plans): "
                    "predicted prefill 15,800 tok/s, decode 451.2 tok/s (the assumed plan "
                    "said 3,375/294.5)")


@pytest.mark.parametrize("failure", [
    enginestep.EngineStepError("the engine answered 401\nUnauthorized"),
    ValueError("no JSON"), OSError(111, "Connection refused"), KeyError("usage")])
def test_a_failed_timing_is_one_line_and_the_assumed_plan_stands(
        tmp_path: Path, failure: Exception) -> None:
    env = {"TOPOSERVE_CACHE": str(tmp_path)}

    def timer(e: object, served: Served) -> str:
        raise failure

    replanned: list[int] = []

    def replan() -> Prediction:
        replanned.append(1)
        return TIMED

    done = enginesteps.calibrate_served(env, SERVED, ASSUMED, replan, timer=timer)
    assert not done.ok
    line = done.line
    assert line.startswith("timing this machine's CPU engine failed (")
    assert line.endswith("serving on the assumed plan")
    assert "\n" not in line
    assert replanned == []


def test_a_timing_the_cache_did_not_keep_or_a_replan_that_fails_says_so_in_one_line(
        tmp_path: Path) -> None:
    env = {"TOPOSERVE_CACHE": str(tmp_path)}
    unkept = enginesteps.calibrate_served(env, SERVED, ASSUMED, lambda: TIMED,
                                          timer=lambda e, s: "not kept")
    assert not unkept.ok
    assert "did not keep it; serving on the assumed plan" in unkept.line

    def fails() -> Prediction:
        raise RuntimeError("no\nplan")

    failed = enginesteps.calibrate_served(env, SERVED, ASSUMED, fails,
                                          timer=lambda e, s: str(kept(env)))
    assert not failed.ok
    assert failed.line.endswith("planning with it failed (no plan); serving on the assumed plan")


def test_no_calibrate_is_serves_option() -> None:
    assert build_parser().parse_args(["serve", "--no-calibrate"]).calibrate is False
    assert build_parser().parse_args(["serve"]).calibrate is True


def test_another_model_or_engine_on_the_cpu_gets_the_probe_hint_and_no_calibrate_silences_it(
        tmp_path: Path, tiny_model_path: str) -> None:
    cache = fresh_cache(tmp_path / "cache", tiny_model=tiny_model_path)
    env = {**os.environ, "TOPOSERVE_CACHE": str(cache)}
    model = str(Path(tiny_model_path))  # named with --model: not the embedded default

    def dry(*extra: str) -> str:
        done = subprocess.run([sys.executable, "-m", "launcher", "serve", "--dry-run", *extra],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return " ".join(done.stdout.split())

    assert "`launcher probe --measure` once times this machine's CPU engine" in dry(
        "--model", model)
    assert "probe --measure` once times" not in dry("--model", model, "--no-calibrate")
    assert "probe --measure` once times" not in dry()  # the embedded model: serve times it
    # the embedded model with vLLM flags of the user's own is another engine than the one
    # `probe --measure` times: the hint, not a timing kept for every later plan
    assert "probe --measure` once times" in dry("--", "--enforce-eager")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_during_the_first_serve_timing_cuts_it_short_keeps_nothing_and_leaves_nothing(
        tmp_path: Path, tiny_model_path: str, sig: signal.Signals) -> None:
    """A supervisor's SIGTERM (or Ctrl-C) while serve times its engine, before the proxy: the
    timing ends at once (not when its request does: the stand-in holds each one 30 s) and
    the serve stops as any stop does, exit 0, its engine gone, no record kept."""
    cache = fresh_cache(tmp_path / "cache", tiny_model=tiny_model_path)
    state = tmp_path / "state"
    env = {**os.environ, "TOPOSERVE_CACHE": str(cache), "STANDIN_STATE": str(state),
           "TOPOSERVE_ENGINE_CMD": f"{sys.executable} {STANDIN}",
           "STANDIN_COMPLETION_DELAY": "30"}
    port = free_port()
    run = stop_once_held(["-m", "launcher", "serve", "--port", str(port), "--log-dir",
                          str(tmp_path / "logs"), "--grace", "5"], env, state, sig, tmp_path,
                         exit_s=90)
    said = run.said
    assert run.code == 0, said
    assert run.took_s < 5, f"{run.took_s:.1f} s from the signal to exit: {said}"
    assert "Traceback" not in said
    assert said.count("cut short") == 1, said
    assert "nothing kept" in said
    assert "no process left behind" in said
    assert not engines_alive(state)
    assert enginestep.load(cache, enginesteps.key_here(env)) is None
    assert not (cache / "engine-step").exists() or not any((cache / "engine-step").iterdir())
    assert not http_ok(f"http://127.0.0.1:{port}/health")


class _Held(BaseHTTPRequestHandler):
    """Reads a request and answers nothing until the test lets it go."""

    release = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.release.wait(30)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize("at_once", [False, True], ids=["one-stream", "streams-at-once"])
def test_a_stop_inside_the_guards_cutting_ends_a_held_timed_request_at_once(
        at_once: bool) -> None:
    """The cut reaches both ways the timing sends: one stream from a client (blocked in a
    socket read) and the streams sent at once from an event loop; a stop asked before the
    window opens cuts on entry."""
    release = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Held", (_Held,), {"release": release}))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    served = Served(f"http://127.0.0.1:{server.server_address[1]}", "m")
    guard = SignalGuard()

    def timed() -> object:
        if at_once:
            return enginestep.time_batch(served, [[5, 6, 7]] * 4, 2)
        return enginestep.time_served(served, 1000, rounds=1, depth=0, batch=0)

    try:
        with guard.installed():
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
            started = time.monotonic()
            with pytest.raises(StopCut), guard.cutting():
                timed()
            took = time.monotonic() - started
            assert guard.stopping
            assert not guard.cuttable
            with pytest.raises(StopCut), guard.cutting():
                raise AssertionError("a window opened after the stop ran")
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    assert took < 2.0, took
