"""A launcher command run on the stand-in engine (tests/serve/standin_engine.py) and stopped with
a signal while the stand-in holds its first completion: the shape of every stop test."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.engine.supervise import group_alive

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "serve" / "standin_engine.py"


@dataclass(frozen=True)
class Stopped:
    code: int  # the command's exit code
    took_s: float  # from the signal to the exit
    said: str  # its stdout and stderr


def stop_once_held(argv: list[str], env: dict[str, str], state: Path, sig: signal.Signals,
                   logs: Path, *, exit_s: float) -> Stopped:
    """Run ``argv`` from the repo with ``env`` (which names the stand-in and its STANDIN_STATE
    ``state``), wait (up to 120 s) until a completion is held there (the `completions` file),
    send ``sig``, and wait up to ``exit_s`` for the exit; killed if it is still running."""
    out, err = logs / "cmd.out", logs / "cmd.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=o, stderr=e)
    try:
        deadline = time.monotonic() + 120
        while not (state / "completions").exists():
            assert proc.poll() is None, out.read_text() + err.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        time.sleep(0.3)
        sent = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=exit_s)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Stopped(code, took, out.read_text() + err.read_text())


def engines_alive(state: Path) -> list[str]:
    """The stand-in's starts (STANDIN_STATE's `starts` lines) whose process group still runs."""
    return [line for line in (state / "starts").read_text().splitlines()
            if group_alive(json.loads(line)["pgid"])]
