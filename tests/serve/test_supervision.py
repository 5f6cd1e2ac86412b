"""`launcher serve` as a user runs it, with a stand-in engine: failed starts, restarts, stop.

The stand-in (standin_engine.py) replaces vLLM through TOPOSERVE_ENGINE_CMD so that each fault
happens on cue; the proxy in front of it is the real one.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.engine.supervise import group_alive
from tests.conftest import REPO, free_port, http_ok

STANDIN = Path(__file__).with_name("standin_engine.py")


class Launch:
    def __init__(self, tmp: Path, env: dict[str, str], *args: str) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.out = tmp / "launcher.out"
        self.err = tmp / "launcher.err"
        full_env = {**os.environ, "TOPOSERVE_ENGINE_CMD": f"{sys.executable} {STANDIN}",
                    "STANDIN_STATE": str(tmp / "state"), **env}
        # --no-calibrate: the stand-in engine is not the CPU engine a first serve times
        argv = [sys.executable, "-m", "launcher", "serve", "--port", str(self.port),
                "--log-dir", str(tmp / "logs"), "--grace", "5", "--no-calibrate", *args]
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(argv, env=full_env, cwd=REPO, stdout=out, stderr=err)

    def starts(self) -> list[dict[str, object]]:
        path = self.tmp / "state" / "starts"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if http_ok(f"http://127.0.0.1:{self.port}/ready"):
                return
            assert self.proc.poll() is None, self.output()
            time.sleep(0.3)
        raise AssertionError(f"not ready: {self.output()}")

    def in_flight(self) -> float:
        """Requests the proxy is answering now, from its own gauge."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("toposerve_requests_in_flight{"))

    def wait_in_flight(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.in_flight() < n:
            assert time.monotonic() < deadline, f"never {n} in flight: {self.output()}"
            time.sleep(0.05)

    def output(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def assert_nothing_left(self) -> None:
        for start in self.starts():
            assert not group_alive(int(str(start["pgid"]))), f"engine group left: {start}"


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[list[Launch]]:
    made: list[Launch] = []
    yield made
    for item in made:
        if item.proc.poll() is None:
            item.proc.kill()
            item.proc.wait()


def test_symmetric_memory_crash_is_retried_once_with_the_safe_fallback(
    tmp_path: Path, launch: list[Launch]
) -> None:
    run = Launch(tmp_path, {"STANDIN_FAIL": "symm-mem"})
    launch.append(run)
    run.wait_ready()
    starts = run.starts()
    assert len(starts) == 2
    assert starts[0]["symm"] is None
    assert starts[1]["symm"] == "0"
    assert "--compilation-config" in starts[1]["argv"]  # type: ignore[operator]
    out = run.output()
    assert "symmetric-memory all-reduce crashed" in out
    assert "Retrying once with: VLLM_ALLREDUCE_USE_SYMM_MEM=0 --compilation-config" in out
    assert run.stop() == 0
    run.assert_nothing_left()


def test_an_unrecognised_start_failure_is_one_line_with_the_log_path(
    tmp_path: Path, launch: list[Launch]
) -> None:
    run = Launch(tmp_path, {"STANDIN_FAIL": "always"})
    launch.append(run)
    code = run.proc.wait(timeout=120)
    err = run.err.read_text()
    assert code == 4
    assert "Traceback" not in run.output()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1].startswith("launcher: error: vLLM failed to start: ValueError: standin")
    assert "full log:" in lines[-1]
    assert len(run.starts()) == 1  # not recognised: no blind retry
    run.assert_nothing_left()


def test_an_engine_that_dies_is_restarted_and_the_stack_serves_again(
    tmp_path: Path, launch: list[Launch]
) -> None:
    run = Launch(tmp_path, {"STANDIN_DIE_AFTER": "2"})
    launch.append(run)
    run.wait_ready()
    deadline = time.monotonic() + 60
    while len(run.starts()) < 2 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert len(run.starts()) == 2, run.output()
    run.wait_ready()
    assert "restart 1/5" in run.output()
    assert run.stop() == 0
    run.assert_nothing_left()


def test_sigterm_stops_proxy_and_engine_with_nothing_left(
    tmp_path: Path, launch: list[Launch]
) -> None:
    run = Launch(tmp_path, {})
    launch.append(run)
    run.wait_ready()
    assert run.stop() == 0
    run.assert_nothing_left()
    assert not http_ok(f"http://127.0.0.1:{run.port}/health")
    assert "no process left behind" in run.output()


def test_a_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "launcher", "serve", "--port", str(port)],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 5
    assert res.stderr.strip().count("\n") == 0
    assert f"port {port} on 127.0.0.1 is already in use" in res.stderr
    assert "--port" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_missing_model_is_a_one_line_error(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "launcher", "serve", "--port", str(free_port()),
         "--model", str(tmp_path / "no-such-model")],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0
    assert "does not exist" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_log_folder_that_cannot_be_written_is_a_one_line_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = subprocess.run(
        [sys.executable, "-m", "launcher", "serve", "--port", str(free_port()),
         "--log-dir", str(blocker / "logs")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "TOPOSERVE_ENGINE_CMD": f"{sys.executable} {STANDIN}"})
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0, res.stderr
    assert f"cannot write logs to {blocker / 'logs'}" in res.stderr
    assert "--log-dir" in res.stderr


def _post_completion(port: int, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", method="POST",
        data=json.dumps({"model": "standin", "prompt": "x", "max_tokens": 3}).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def test_while_the_engine_restarts_the_proxy_answers_503_with_retry_after(
    tmp_path: Path, launch: list[Launch]
) -> None:
    gate = tmp_path / "restarted-engine-listens"
    run = Launch(tmp_path, {"STANDIN_DIE_AFTER": "1", "STANDIN_RESTART_GATE": str(gate)})
    launch.append(run)
    # The first engine dies 1 s after it is ready, which on a loaded machine can be before the
    # proxy is: the launcher must carry on and restart it either way, so the test waits for the
    # second start (not for /ready, which may only come after it). That start does not listen
    # until the test has its answer (the gate): however slow the machine, the proxy is asked
    # while the engine is away.
    deadline = time.monotonic() + 60
    while len(run.starts()) < 2 and time.monotonic() < deadline:
        assert run.proc.poll() is None, run.output()
        time.sleep(0.1)
    assert len(run.starts()) == 2, run.output()
    # The restarted engine does not listen yet: meanwhile the proxy must refuse, not hang (an
    # answer not there within 5 s counts as none).
    window_end = time.monotonic() + 30.0
    status, headers, body = 0, {}, b"no answer"
    while status != 503 and time.monotonic() < window_end:
        try:
            status, headers, body = _post_completion(run.port, timeout=5)
        except OSError:  # the proxy not listening yet
            time.sleep(0.1)
    assert status == 503, body
    assert int(headers["retry-after"]) > 0
    assert json.loads(body)["error"]["type"]
    assert not http_ok(f"http://127.0.0.1:{run.port}/ready")
    gate.touch()
    run.wait_ready(60)
    assert _post_completion(run.port)[0] == 200
    assert run.stop() == 0
    run.assert_nothing_left()


def test_sigterm_under_load_finishes_accepted_requests_within_the_grace_period(
    tmp_path: Path, launch: list[Launch]
) -> None:
    run = Launch(tmp_path, {"STANDIN_COMPLETION_DELAY": "2"})
    launch.append(run)
    run.wait_ready()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_post_completion, run.port) for _ in range(4)]
        run.wait_in_flight(4)  # all four accepted and in flight at the engine
        run.proc.send_signal(signal.SIGTERM)
        results = [f.result(timeout=30) for f in futures]
    assert [status for status, _, _ in results] == [200] * 4
    assert run.proc.wait(timeout=60) == 0
    run.assert_nothing_left()


def test_a_second_signal_forces_exit_at_once(tmp_path: Path, launch: list[Launch]) -> None:
    run = Launch(tmp_path, {"STANDIN_COMPLETION_DELAY": "30"})
    launch.append(run)
    run.wait_ready()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(_post_completion, run.port, 5)
        run.wait_in_flight(1)
        run.proc.send_signal(signal.SIGTERM)  # drains: would wait for the 30 s request
        time.sleep(1.0)
        started = time.monotonic()
        run.proc.send_signal(signal.SIGTERM)
        code = run.proc.wait(timeout=10)
    assert time.monotonic() - started < 20  # the second SIGTERM did not wait out the 30 s drain
    assert code == 128 + signal.SIGTERM
    time.sleep(0.5)
    run.assert_nothing_left()


def test_the_engine_runs_exactly_the_command_plan_prints(
    tmp_path: Path, launch: list[Launch], tiny_model_path: str
) -> None:
    engine_port = free_port()
    args = ("--model", tiny_model_path, "--prompt", "64", "--gen", "8", "--", "--max-num-seqs", "5")
    planned = subprocess.run(
        [sys.executable, "-m", "launcher", "plan", "--json", "--port", str(engine_port), *args],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    argv = json.loads(planned.stdout)["argv"]
    run = Launch(tmp_path, {}, "--engine-port", str(engine_port), *args)
    launch.append(run)
    run.wait_ready()
    (start,) = run.starts()
    # engine.py starts `vllm serve MODEL ...` as the api_server module with --model MODEL; the
    # one addition is the middleware that asks the run's key (set beside it, never printed)
    assert start["argv"] == ["--model", argv[2], *argv[3:], "--middleware",
                             "launcher.engine.vllm_keyguard.KeyGuard"]
    assert run.stop() == 0
    run.assert_nothing_left()
