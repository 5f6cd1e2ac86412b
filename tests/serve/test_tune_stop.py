"""A stop during `launcher tune`'s measuring: the round ends at once, nothing is left running."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from launcher.engine.supervise import free_port
from tests.support.cache import fresh_cache
from tests.support.standin import STANDIN, engines_alive, stop_once_held


def loadgen_alive(results: Path) -> bool:
    """A loadgen process still writing into ``results`` (its --json path names it)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "loadgen" in cmd and str(results) in cmd:
            return True
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_during_a_tune_round_ends_it_at_once_and_leaves_nothing(
        tmp_path: Path, tiny_model_path: str, sig: signal.Signals) -> None:
    """A supervisor's SIGTERM (or Ctrl-C) while a round's loadgen waits on the engine (the
    stand-in holds each completion 60 s): tune stops within seconds, not when the round would
    have ended, with its loadgen and the candidate's engine gone and no traceback."""
    cache = fresh_cache(tmp_path / "cache", tiny_model=tiny_model_path)
    state, results = tmp_path / "state", tmp_path / "results"
    env = {**os.environ, "TOPOSERVE_CACHE": str(cache), "STANDIN_STATE": str(state),
           "TOPOSERVE_ENGINE_CMD": f"{sys.executable} {STANDIN}",
           "STANDIN_COMPLETION_DELAY": "60"}
    run = stop_once_held(
        ["-m", "launcher", "tune", "--port", str(free_port()),
         "--prompt", "16", "--gen", "4", "--concurrency", "1", "--requests", "1",
         "--repeats", "1", "--warmup", "0", "--reruns", "0",
         "--candidate", "name=only", "--out", str(tmp_path / "plan.json"),
         "--log-dir", str(tmp_path / "logs"), "--results-dir", str(results),
         "--ready-timeout", "60"], env, state, sig, tmp_path, exit_s=120)
    said = run.said
    assert run.code == 130, said
    assert run.took_s < 10, f"{run.took_s:.1f} s from the signal to exit: {said}"
    assert "Traceback" not in said
    assert "no process left behind" in said
    assert not loadgen_alive(results)
    assert not engines_alive(state)
