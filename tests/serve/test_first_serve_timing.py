"""`launcher serve`'s first run on a machine without GPUs: it times the CPU engine it has just
started (the embedded model, no timing kept here), keeps the record and prints the calibrated
plan beside the assumed one; any failure of that is one line and the serve goes on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli.main import build_parser
from launcher.pipeline import enginesteps
from launcher.planner.costmodel import Prediction
from launcher.probe import enginestep
from launcher.probe.enginestep import EngineStep, Served
from tests.support.cache import fresh_cache

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
