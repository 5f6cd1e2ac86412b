"""The safety net on the real vLLM CPU engine: a context its KV cache cannot hold.

The embedded model with its positions raised to 1,048,576 (2 KiB of KV per token) is asked for
all of them (`launcher serve --max-model-len 1048576`: the CPU plan passes an asked length
through); the 1 GiB KV cache `launcher serve` gives the CPU engine holds about half. vLLM
refuses, `launcher serve` reads the refusal, starts it again with the length vLLM names, and
the stack then answers a request.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, free_port, http_ok
from tests.support import early

pytestmark = pytest.mark.stack
ASKED = 1 << 20


Refused = tuple[subprocess.Popen[bytes], int, Path]


def begin_refused(tmp_path: Path) -> Refused:
    """`launcher serve` asked for the whole length, once its proxy answers /ready."""
    from launcher.model.tinymodel import ensure_tiny_model

    model = tmp_path / "long-tiny"
    shutil.copytree(ensure_tiny_model(early.environ()), model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["max_position_embeddings"] = ASKED
    (model / "config.json").write_text(json.dumps(cfg))
    port = free_port()
    out = tmp_path / "launcher.out"
    env = {k: v for k, v in early.environ().items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    argv = [
        sys.executable,
        "-m",
        "launcher",
        "serve",
        "--port",
        str(port),
        "--model",
        str(model),
        "--max-model-len",
        str(ASKED),
        "--log-dir",
        str(tmp_path / "logs"),
        "--grace",
        "10",
        # Both starts skip vLLM's torch.compile tracing (about a minute each on two cores, redone
        # at every start: vLLM 0.32's CPU engine fails to load its own AOT cache). The refusal is
        # vLLM's KV-cache check, made the same way either way; the compiled start is the stack's.
        "--",
        "--enforce-eager",
    ]
    with out.open("wb") as fh:
        proc = subprocess.Popen(
            argv, env=env, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 600
        while not http_ok(f"http://127.0.0.1:{port}/ready"):
            assert proc.poll() is None, out.read_text()[-3000:]
            assert time.monotonic() < deadline, out.read_text()[-3000:]
            early.pause(1)
    except BaseException:
        end_refused((proc, port, out))
        raise
    return proc, port, out


def end_refused(refused: Refused) -> None:
    proc = refused[0]
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# Both starts are begun in the background at collection (this test runs after the pure ones).
refused = early.held(__file__, "refused", begin_refused, end_refused, scope="function")


def test_vllm_cpu_refusal_is_restarted_at_its_own_length(refused: Refused) -> None:
    _, port, out = refused
    text = out.read_text()
    said = re.search(
        r"cannot hold the (\d+)-token context.*?"
        r"starting again with --max-model-len (\d+)",
        text,
        re.S,
    )
    assert said, text[-3000:]
    planned, retried = int(said.group(1)), int(said.group(2))
    assert planned == ASKED
    assert 0 < retried < planned
    models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
    assert models["data"][0]["max_model_len"] == retried
    body = {"model": models["data"][0]["id"], "prompt": "def f():", "max_tokens": 4}
    r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
