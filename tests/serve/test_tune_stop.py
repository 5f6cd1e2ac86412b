"""A stop during `launcher tune`'s measuring: the round ends at once, nothing is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.engine.supervise import free_port, group_alive
from tests.support.cache import fresh_cache

REPO = Path(__file__).resolve().parents[2]
STANDIN = Path(__file__).with_name("standin_engine.py")


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
    out, err = tmp_path / "tune.out", tmp_path / "tune.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launcher", "tune", "--port", str(free_port()),
             "--prompt", "16", "--gen", "4", "--concurrency", "1", "--requests", "1",
             "--repeats", "1", "--warmup", "0", "--reruns", "0",
             "--candidate", "name=only", "--out", str(tmp_path / "plan.json"),
             "--log-dir", str(tmp_path / "logs"), "--results-dir", str(results),
             "--ready-timeout", "60"],
            cwd=REPO, env=env, stdout=o, stderr=e)
    try:
        deadline = time.monotonic() + 120
        while not (state / "completions").exists():  # the round's first request is held
            assert proc.poll() is None, out.read_text() + err.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        time.sleep(0.3)
        sent = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=120)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = out.read_text() + err.read_text()
    assert code == 130, said
    assert took < 10, f"{took:.1f} s from the signal to exit: {said}"
    assert "Traceback" not in said
    assert "no process left behind" in said
    assert not loadgen_alive(results)
    for line in (state / "starts").read_text().splitlines():
        assert not group_alive(json.loads(line)["pgid"]), line
