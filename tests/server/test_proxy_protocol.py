"""The proxy against the simulated engine: what passes through, what is added, what is counted."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from simengine.client import StreamResult, stream
from tests.server.conftest import ProxyProc, SpawnProxy, sim_stats


def events(text: str) -> list[str]:
    return [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]


def samples(proxy_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(proxy_url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(proxy_url: str, name: str, **labels: str) -> float:
    return samples(proxy_url).get((name, tuple(sorted(labels.items()))), 0.0)


CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "a b c"}],
        "max_tokens": 4, "stream": True}


def test_stream_passes_unchanged_without_the_usage_it_asked_for(proxy: ProxyProc,
                                                                 sim_url: str) -> None:
    direct = httpx.post(sim_url + "/v1/chat/completions", json=CHAT)
    proxied = httpx.post(proxy.url + "/v1/chat/completions", json=CHAT)
    assert proxied.status_code == 200
    assert proxied.headers["content-type"] == direct.headers["content-type"]
    strip_ids = [json.loads(e) | {"id": "", "created": 0} if e != "[DONE]" else e
                 for e in events(proxied.text)]
    expected = [json.loads(e) | {"id": "", "created": 0} if e != "[DONE]" else e
                for e in events(direct.text)]
    assert strip_ids == expected
    assert all('"usage"' not in e for e in events(proxied.text))


def test_usage_is_forwarded_when_the_client_asks(proxy: ProxyProc) -> None:
    body = CHAT | {"stream_options": {"include_usage": True}}
    evs = events(httpx.post(proxy.url + "/v1/chat/completions", json=body).text)
    assert json.loads(evs[-2])["usage"]["completion_tokens"] == 4
    assert evs[-1] == "[DONE]"


def test_bytes_between_events_are_exactly_the_engines(proxy: ProxyProc, sim_url: str) -> None:
    body = {"prompt": "x", "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}
    direct = httpx.post(sim_url + "/v1/completions", json=body).content
    proxied = httpx.post(proxy.url + "/v1/completions", json=body).content
    # Same bytes once the per-request id and timestamp are blanked.
    def blank(raw: bytes) -> bytes:
        out = raw
        for e in events(raw.decode()):
            if e != "[DONE]":
                obj = json.loads(e)
                out = out.replace(obj["id"].encode(), b"ID").replace(
                    str(obj["created"]).encode(), b"T")
        return out
    assert blank(proxied) == blank(direct)


def test_token_counts_and_latencies_are_recorded(proxy: ProxyProc) -> None:
    before = metric(proxy.url, "toposerve_generation_tokens_total", model="sim-model")
    httpx.post(proxy.url + "/v1/chat/completions", json=CHAT)
    httpx.post(proxy.url + "/v1/chat/completions", json=CHAT | {"stream": False})
    s = samples(proxy.url)
    assert s[("toposerve_generation_tokens_total", (("model", "sim-model"),))] == before + 8
    labels = (("model", "sim-model"), ("route", "/v1/chat/completions"))
    assert s[("toposerve_ttft_seconds_count", labels)] >= 1
    assert s[("toposerve_itl_seconds_count", labels)] >= 3
    assert s[("toposerve_e2e_seconds_count", labels)] >= 2
    ok = (("model", "sim-model"), ("route", "/v1/chat/completions"), ("status", "200"))
    assert s[("toposerve_requests_total", ok)] >= 2
    assert ("toposerve_requests_queued", ()) in s
    assert s[("toposerve_requests_in_flight", labels[:2])] == 0


def test_proxy_ttft_histogram_sees_the_engines_ttft(spawn_proxy: SpawnProxy,
                                                     sim_url: str) -> None:
    p = spawn_proxy([sim_url])
    httpx.post(sim_url + "/sim/control", json={"ttft": 0.2, "itl": 0.01})
    httpx.post(p.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True})
    labels = (("model", "unknown"), ("route", "/v1/completions"))
    s = samples(p.url)
    ttft = s[("toposerve_ttft_seconds_sum", labels)] / s[("toposerve_ttft_seconds_count", labels)]
    assert 0.2 <= ttft < 0.26
    assert s[("toposerve_ttft_seconds_bucket", (("le", "0.2"), *labels))] == 0
    assert s[("toposerve_ttft_seconds_bucket", (("le", "0.3"), *labels))] == 1


def test_plan_info_and_upstream_state_are_exported(spawn_proxy: SpawnProxy, sim_url: str) -> None:
    plan = {"mode": "tp", "tp": 2, "pp": 1, "dp": 1, "engine": "vllm", "transport": "nvlink",
            "model": "m", "gpus": [0, 1]}
    p = spawn_proxy([sim_url], "--plan-info", json.dumps(plan))
    s = samples(p.url)
    info = tuple(sorted({"mode": "tp", "tp": "2", "pp": "1", "dp": "1", "engine": "vllm",
                         "transport": "nvlink", "model": "m", "gpus": "0,1"}.items()))
    assert s[("toposerve_plan_info", info)] == 1
    assert s[("toposerve_upstream_up", (("upstream", sim_url),))] == 1


def test_non_streamed_json_passes_through(proxy: ProxyProc, sim_url: str) -> None:
    r = httpx.post(proxy.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
    assert r.status_code == 200
    assert r.json()["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/v1/models", None), ("POST", "/tokenize", {"prompt": "a b"}),
    ("GET", "/version", None), ("GET", "/no/such/route", None)])
def test_other_routes_pass_through_unchanged(proxy: ProxyProc, sim_url: str, method: str,
                                             path: str, body: object) -> None:
    direct = httpx.request(method, sim_url + path, json=body)
    proxied = httpx.request(method, proxy.url + path, json=body)
    assert proxied.status_code == direct.status_code
    if path == "/v1/models":
        assert [m["id"] for m in proxied.json()["data"]] == ["sim-model"]
    else:
        assert proxied.content == direct.content


def test_request_id_is_kept_or_made_and_sent_upstream(proxy: ProxyProc, sim_url: str) -> None:
    r = httpx.post(proxy.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                   headers={"x-request-id": "agent-42.turn-7"})
    assert r.headers["x-request-id"] == "agent-42.turn-7"
    assert sim_stats(sim_url)["last_headers"]["x-request-id"] == "agent-42.turn-7"
    made = httpx.post(proxy.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert len(made.headers["x-request-id"]) == 32
    odd = httpx.post(proxy.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                     headers={"x-request-id": "a b<script>"})
    assert odd.headers["x-request-id"] != "a b<script>"


def test_health_and_ready(proxy: ProxyProc) -> None:
    assert httpx.get(proxy.url + "/health").json() == {"status": "ok"}
    ready = httpx.get(proxy.url + "/ready")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True


def test_a_client_closing_after_its_last_chunk_is_no_abort(spawn_proxy: SpawnProxy,
                                                           sim_url: str) -> None:
    """A client may close as soon as it has read the end of its response, while the proxy still
    reads the engine's closing chunk: that request is a 200 (it was a 499 now and then, and its
    engine connection was closed instead of pooled)."""
    p = spawn_proxy([sim_url])
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 8, "stream": True}

    async def burst() -> list[StreamResult]:
        return list(await asyncio.gather(*(stream(p.url + "/v1/completions", body)
                                           for _ in range(64))))

    for _ in range(3):
        results = asyncio.run(burst())
        assert all(r.error is None and len(r.token_times) == 8 for r in results)
    s = samples(p.url)
    route = (("model", "sim-model"), ("route", "/v1/completions"))
    assert s[("toposerve_requests_total", (*route, ("status", "200")))] == 192
    assert ("toposerve_requests_total", (*route, ("status", "499"))) not in s
    assert sim_stats(sim_url)["aborted"] == 0
