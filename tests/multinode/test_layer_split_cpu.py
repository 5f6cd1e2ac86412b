"""The furthest vLLM's CPU build goes towards the multi-node path: `launcher serve --pp 2`, the
model's layers in two pipeline stages, each a worker process (vLLM's multiprocessing executor
on one machine; on Ray it refuses, see test_ray_serve.py), behind the proxy."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from launcher.engine.supervise import group_alive, http_ok
from tests.conftest import REPO
from tests.multinode.procs import descendants, serve, still_alive
from tests.support import early

PP2 = tuple[subprocess.Popen[bytes], str, Path]


def begin_pp2(tmp: Path) -> PP2:
    """`launcher serve --pp 2` on the CPU engine, once it answers /ready."""
    proc, port = serve(tmp, "--pp", "2", env=early.environ())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    try:
        while not http_ok(f"{url}/ready"):
            assert proc.poll() is None, (tmp / "launcher.out").read_text() + (
                tmp / "launcher.err").read_text()
            assert time.monotonic() < deadline, "launcher serve --pp 2 did not become ready"
            early.pause(1.0)
    except BaseException:
        end_pp2((proc, url, tmp))
        raise
    return proc, url, tmp


def end_pp2(pp2: PP2) -> None:
    proc = pp2[0]
    if proc.poll() is None:
        proc.kill()
        proc.wait()


# `launcher serve --pp 2` on the CPU engine, started once for the tests below: begun in the
# background at collection (its tests run after the pure ones)
pp2 = early.held(__file__, "pp2", begin_pp2, end_pp2)


def test_pp2_runs_two_layer_stages_as_workers_behind_the_proxy(
    pp2: PP2,
) -> None:
    proc, url, _ = pp2
    models = httpx.get(f"{url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["toposerve-tiny"]
    # the stages, from the process table: vLLM names each worker after its pipeline rank
    titles = [p.title for p in descendants(proc.pid)]
    assert sorted(t for t in titles if t.startswith("VLLM::Worker_")) == [
        "VLLM::Worker_PP0", "VLLM::Worker_PP1"], titles


def test_pp2_streams_a_completion_with_exact_token_counts(
    pp2: PP2,
) -> None:
    _, url, _ = pp2
    body = {"model": "toposerve-tiny", "prompt": list(range(10, 42)), "max_tokens": 24,
            "min_tokens": 24, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    texts = [e["choices"][0]["text"] for e in events if e.get("choices")]
    assert len(texts) >= 2  # streamed, not one answer at the end
    usage = events[-1]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (32, 24)


def test_pp2_loadgen_gets_exact_token_counts(
    pp2: tuple[subprocess.Popen[bytes], str, Path], tmp_path: Path
) -> None:
    _, url, _ = pp2
    out = tmp_path / "run.json"
    done = subprocess.run(
        [sys.executable, "-m", "loadgen", "--url", url, "--prompt", "512", "--gen", "64",
         "--requests", "2", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    assert data["summary"]["requests_ok"] == 2
    assert data["summary"]["requests_failed"] == 0
    requests = data["requests"]
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in requests] == [(512, 64)] * 2


def test_pp2_sigterm_stops_the_proxy_and_both_stages(
    pp2: PP2,
) -> None:
    proc, url, tmp = pp2
    tree = descendants(proc.pid)
    assert any(p.title.startswith("VLLM::Worker_PP") for p in tree)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    assert not http_ok(f"{url}/health")
    assert still_alive(tree) == []
    assert not any(group_alive(p.pgid) for p in tree)
    assert "no process left behind" in (tmp / "launcher.out").read_text()
