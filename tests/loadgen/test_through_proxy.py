"""loadgen through the real toposerve proxy (python -m server) in front of the simulated engine:
the plan label comes from the proxy's toposerve_plan_info, counts stay exact end to end, and an
API key the proxy wants is asked for in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.loadgen.conftest import REPO, run_cli
from tests.support.prom import free_port

PLAN = {
    "mode": "tp",
    "tp": "2",
    "pp": "1",
    "dp": "1",
    "engine": "sim",
    "transport": "nvlink",
    "model": "sim-model",
    "gpus": "0,1",
}
KEY = "sekrit-key"


def _start_proxy(sim_url: str, log_path: Path, key: str | None) -> Iterator[str]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "server",
        "--upstream",
        sim_url,
        "--port",
        str(port),
        "--plan-info",
        json.dumps(PLAN),
        *(["--api-key", key] if key else []),
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, f"the proxy never got ready: {log_path.read_text()}"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.fixture
def proxy_url(sim_url: str, tmp_path: Path) -> Iterator[str]:
    yield from _start_proxy(sim_url, tmp_path / "proxy.log", None)


@pytest.fixture
def keyed_proxy_url(sim_url: str, tmp_path: Path) -> Iterator[str]:
    yield from _start_proxy(sim_url, tmp_path / "proxy.log", KEY)


def _exact(out: Path, prompt: int, gen: int, n: int) -> dict:  # type: ignore[type-arg]
    data = json.loads(out.read_text())
    rows = [(r["prompt_tokens"], r["completion_tokens"], r["error"]) for r in data["requests"]]
    assert rows == [(prompt, gen, None)] * n
    return data  # type: ignore[no-any-return]


def test_plan_label_and_exact_counts_through_the_proxy(proxy_url: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = run_cli(
        "--url",
        proxy_url,
        "--prompt",
        "256",
        "--gen",
        "16",
        "--concurrency",
        "2",
        "--requests",
        "4",
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    data = _exact(out, 256, 16, 4)
    assert data["config"]["plan"] == "mode=tp,tp=2,pp=1,dp=1,transport=nvlink,engine=sim"
    assert "mode=tp,tp=2,pp=1" in result.stdout


def test_api_key_is_sent_and_a_missing_one_is_asked_for(
    keyed_proxy_url: str, tmp_path: Path
) -> None:
    missing = run_cli("--url", keyed_proxy_url, "--prompt", "8", "--gen", "4", "--requests", "1")
    assert missing.returncode == 1
    assert "Traceback" not in missing.stderr
    assert "pass --api-key" in missing.stderr
    out = tmp_path / "r.json"
    given = run_cli(
        "--url",
        keyed_proxy_url,
        "--api-key",
        KEY,
        "--prompt",
        "8",
        "--gen",
        "4",
        "--requests",
        "2",
        "--json",
        str(out),
    )
    assert given.returncode == 0, given.stderr
    _exact(out, 8, 4, 2)
