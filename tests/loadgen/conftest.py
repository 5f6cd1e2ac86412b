"""A simulated engine with known timings (simengine.engine), in its own process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from simengine.engine import SimConfig, spawn

TTFT = 0.08
ITL = 0.012
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def sim_url() -> Iterator[str]:
    """80 ms to the first token, 12 ms between tokens, exactly."""
    with spawn(SimConfig(port=0, ttft=TTFT, itl=ITL, model="sim-model")) as url:
        yield url


def run_cli(
    *args: str, timeout: float = 120.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m loadgen ARGS` as a user runs it: a real process, its exit code and output."""
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
        env=env,
    )
