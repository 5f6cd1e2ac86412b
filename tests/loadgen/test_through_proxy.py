"""loadgen through the real toposerve proxy (python -m server) in front of the simulated engine:
the plan label comes from the proxy's toposerve_plan_info, and counts stay exact end to end."""

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


@pytest.fixture
def proxy_url(sim_url: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = (tmp_path / "proxy.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "server",
            "--upstream",
            sim_url,
            "--port",
            str(port),
            "--plan-info",
            json.dumps(PLAN),
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, (tmp_path / "proxy.log").read_text()
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


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
    data = json.loads(out.read_text())
    assert data["config"]["plan"] == "mode=tp,tp=2,pp=1,dp=1,transport=nvlink,engine=sim"
    assert "mode=tp,tp=2,pp=1" in result.stdout
    rows = [(r["prompt_tokens"], r["completion_tokens"], r["error"]) for r in data["requests"]]
    assert rows == [(256, 16, None)] * 4
