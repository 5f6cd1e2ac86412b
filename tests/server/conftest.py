"""Fixtures for the proxy's tests: a simulated engine and proxies on free loopback ports, each in
its own process (as they run for real), with their logs kept for the assertions on secrets.

`spawn_proxy(upstreams, *args, env=...)` starts `python -m server`; `sim_url` is a shared
simulated engine reset to a clean state (no fault, healthy, counters zeroed) for every test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from simengine.engine import SimConfig, spawn, stop_process

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def post_json(url: str, body: dict[str, Any], timeout: float = 5.0) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.load(resp)


def sim_stats(url: str) -> dict[str, Any]:
    stats: dict[str, Any] = get_json(url + "/sim/stats")
    return stats


def sim_control(url: str, **settings: Any) -> None:
    post_json(url + "/sim/control", settings)


def wait_for(predicate: Callable[[], bool], timeout: float = 15.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@dataclass(frozen=True)
class ProxyProc:
    url: str
    pid: int
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def run_proxy(upstreams: Sequence[str], *args: str, env: dict[str, str] | None = None,
              log_dir: Path) -> Iterator[ProxyProc]:
    port = free_port()
    argv = [sys.executable, "-m", "server", "--port", str(port), "--health-interval", "0.2"]
    for up in upstreams:
        argv += ["--upstream", up]
    argv += list(args)
    log_path = log_dir / f"proxy-{port}.log"
    full_env = {k: v for k, v in os.environ.items() if k != "TOPOSERVE_API_KEYS"}
    full_env.update(env or {})
    with log_path.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=full_env)
    url = f"http://127.0.0.1:{port}"
    try:
        ok = wait_for(lambda: _up(url + "/health") or proc.poll() is not None, timeout=30)
        if not ok or proc.poll() is not None:
            raise RuntimeError(f"proxy did not start:\n{log_path.read_text()[-3000:]}")
        yield ProxyProc(url, proc.pid, log_path)
    finally:
        stop_process(proc, 15)


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


SpawnProxy = Callable[..., ProxyProc]


@pytest.fixture
def spawn_proxy(tmp_path: Path) -> Iterator[SpawnProxy]:
    """Starts proxies for one test; all are stopped at its end."""
    with ExitStack() as stack:
        def start(upstreams: Sequence[str], *args: str,
                  env: dict[str, str] | None = None) -> ProxyProc:
            return stack.enter_context(run_proxy(upstreams, *args, env=env, log_dir=tmp_path))
        yield start


@pytest.fixture(scope="session")
def _shared_sim() -> Iterator[str]:
    with spawn(SimConfig(ttft=0.02, itl=0.005, max_model_len=100_000)) as url:
        yield url


def _reset(url: str) -> None:
    sim_control(url, fault="", healthy=True, health_delay=0, refuse=0, ttft=0.02, itl=0.005,
                hold=False)
    post_json(url + "/sim/reset", {})


@pytest.fixture
def sim_url(_shared_sim: str) -> str:
    _reset(_shared_sim)
    return _shared_sim


@pytest.fixture(scope="session")
def _shared_proxy(_shared_sim: str,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    log_dir = tmp_path_factory.mktemp("proxy")
    with run_proxy([_shared_sim], "--idle-timeout", "1", "--first-byte-timeout", "3",
                   log_dir=log_dir) as proxy:
        yield proxy


@pytest.fixture
def proxy(_shared_proxy: ProxyProc, sim_url: str) -> ProxyProc:
    """A keyless proxy in front of `sim_url`, with a 1 s idle and 3 s first-byte timeout."""
    return _shared_proxy


def open_sim(config: SimConfig) -> AbstractContextManager[str]:
    return spawn(config)
