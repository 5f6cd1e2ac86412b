"""`launcher serve` when vLLM refuses the planned context: one restart at vLLM's own length."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO, free_port, http_ok

ENGINE = Path(__file__).with_name("kvrefusal_engine.py")


def serve(tmp: Path, limit: int, *args: str) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    env = {**os.environ, "TOPOSERVE_ENGINE_CMD": f"{sys.executable} {ENGINE}",
           "STANDIN_STATE": str(tmp / "state"), "KV_LIMIT_TOKENS": str(limit)}
    out = tmp / "launcher.out"
    argv = [sys.executable, "-m", "launcher", "serve", "--port", str(port),
            "--log-dir", str(tmp / "logs"), "--grace", "5", "--no-calibrate", *args]
    with out.open("wb") as fh:
        proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT)
    return proc, port, out


def wait(proc: subprocess.Popen[bytes], port: int, out: Path, timeout: float = 120) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if http_ok(f"http://127.0.0.1:{port}/ready"):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.3)
    raise AssertionError(out.read_text())


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


def starts(tmp: Path) -> list[list[str]]:
    path = tmp / "state" / "starts"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["argv"] for line in lines]


def test_a_refused_context_is_started_again_at_the_length_vllm_names(tmp_path: Path) -> None:
    # the embedded tiny model plans 4096 tokens; this engine holds 3000
    proc, port, out = serve(tmp_path, 3000)
    try:
        assert wait(proc, port, out), out.read_text()
        text = out.read_text()
        assert (tmp_path / "state" / "refused").read_text().split() == ["4096"]
        argv = starts(tmp_path)[-1]
        assert argv[argv.index("--max-model-len") + 1] == "3000"
        assert "cannot hold the 4096-token context asked of it" in text
        assert "starting again with --max-model-len 3000" in text
    finally:
        assert stop(proc) == 0


def test_a_second_refusal_is_a_one_line_error(tmp_path: Path) -> None:
    # the user's own --max-model-len after `--` wins over the plan's: restarting cannot help
    proc, port, out = serve(tmp_path, 3000, "--", "--max-model-len", "3500")
    try:
        assert not wait(proc, port, out)
        assert proc.wait(timeout=30) != 0
        last = out.read_text().strip().splitlines()[-1]
        assert last.startswith("launcher: error: vLLM failed to start: vLLM cannot hold")
        assert "lower --max-model-len" in last or "--max-model-len 3000" in last
    finally:
        stop(proc)
