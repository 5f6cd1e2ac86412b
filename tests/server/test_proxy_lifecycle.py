"""Start and stop: SIGTERM lets in-flight streams finish (drain), then the proxy exits; bad
configuration is one line with the fix and a non-zero exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx

from tests.server.conftest import REPO, SpawnProxy, sim_control, sim_stats, wait_for


def test_sigterm_drains_streams_in_flight(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--drain-timeout", "10")
    sim_control(sim_url, ttft=0.05, itl=0.02)
    results: list[str] = []

    def client() -> None:
        r = httpx.post(p.url + "/v1/completions", timeout=10,
                       json={"prompt": "x", "max_tokens": 50, "stream": True})
        results.append(r.text)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    assert wait_for(lambda: sim_stats(sim_url)["running"] == 4)  # all four accepted
    os.kill(p.pid, signal.SIGTERM)
    for t in threads:
        t.join()
    assert len(results) == 4
    assert all(text.rstrip().endswith("data: [DONE]") and '"error"' not in text
               for text in results)
    assert wait_for(lambda: not _alive(p.pid), timeout=5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


def test_port_in_use_is_one_line_and_non_zero(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url])
    port = p.url.rsplit(":", 1)[1]
    r = subprocess.run([sys.executable, "-m", "server", "--upstream", sim_url, "--port", port],
                       capture_output=True, text=True, cwd=REPO, timeout=30)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert "address already in use" in r.stderr.lower()


def test_missing_upstream_is_a_usage_error() -> None:
    r = subprocess.run([sys.executable, "-m", "server", "--port", "0"], capture_output=True,
                       text=True, cwd=REPO, timeout=30)
    assert r.returncode == 2
    assert "--upstream" in r.stderr
