"""The proxy in front of an OpenAI-compatible server that is not vLLM and has no /health
(tests/loadgen/standin.py: /v1/models, completions and chat, /metrics, nothing else): the
health checker falls back to GET /v1/models, and requests go through."""

from __future__ import annotations

import json

import httpx

from tests.loadgen.standin import spawn
from tests.server.conftest import SpawnProxy, wait_for


def test_a_server_without_health_is_checked_by_its_model_list(
        spawn_proxy: SpawnProxy, tiny_model_path: str) -> None:
    with spawn("--tokenizer", tiny_model_path, "--ttft", "0.01", "--itl", "0.001") as url:
        assert httpx.get(url + "/health").status_code == 404
        proxy = spawn_proxy([url])
        assert wait_for(lambda: httpx.get(proxy.url + "/ready").status_code == 200, 10, 0.1)
        body = {"model": "standin-model", "prompt": "hello there", "max_tokens": 5, "stream": True,
                "stream_options": {"include_usage": True}}
        with httpx.stream("POST", proxy.url + "/v1/completions", json=body, timeout=20) as r:
            assert r.status_code == 200
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 5
        assert "has no /health: checking it with GET /v1/models" in proxy.log()
