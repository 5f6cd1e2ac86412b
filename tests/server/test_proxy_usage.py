"""Usage through the proxy, in front of vLLM-shaped engines that spell JSON either way: the
client receives what it asked for (no usage chunk it did not ask for, every field it would
have seen), and the token counters count every stream once, on the wire (raw sockets)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from simengine.engine import SimConfig, spawn
from tests.server.conftest import ProxyProc, run_proxy
from tests.server.rawhttp import exchange
from tests.server.test_proxy_protocol import metric

PROMPT = "a b c d e"  # 5 prompt tokens to the simulated engine


@pytest.fixture(scope="module", params=[False, True], ids=["compact", "spaced"])
def engine(request: pytest.FixtureRequest) -> Iterator[str]:
    with spawn(SimConfig(ttft=0.0, itl=0.001, spaced_json=request.param,
                         fingerprint="fp_engine")) as url:
        yield url


@pytest.fixture(scope="module")
def proxy_for(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    """One proxy per engine for the module: every test reads its counters before and after
    (a proxy start is ~1 s of the 22 tests' time, their requests a few ms)."""
    with run_proxy([engine], log_dir=tmp_path_factory.mktemp("usage-proxy")) as proxy:
        yield proxy


def chunks(body: bytes) -> list[dict[str, object]]:
    events = [e for e in body.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    return [json.loads(e[6:]) for e in events[:-1]]


def counters(proxy: ProxyProc) -> tuple[float, float]:
    return (metric(proxy.url, "toposerve_prompt_tokens_total", model="sim-model"),
            metric(proxy.url, "toposerve_generation_tokens_total", model="sim-model"))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("options", [None, {"include_usage": False},
                                     {"continuous_usage_stats": True},
                                     {"include_usage": False, "continuous_usage_stats": True}])
def test_a_client_that_did_not_ask_for_usage_sees_none_and_is_counted(
        proxy_for: ProxyProc, engine: str, path: str, options: object) -> None:
    body: dict[str, object] = {"model": "sim-model", "max_tokens": 4, "stream": True}
    body |= {"messages": [{"role": "user", "content": PROMPT}]} if "chat" in path else {
        "prompt": PROMPT}
    if options is not None:
        body["stream_options"] = options
    direct = chunks(exchange(engine, "POST", path, body).body)
    before = counters(proxy_for)
    answer = exchange(proxy_for.url, "POST", path, body)
    assert answer.status == 200
    got = chunks(answer.body)
    assert all(c["choices"] for c in got)  # no usage chunk: clients read choices[0]
    assert not [c for c in got if "usage" in c]
    # Exactly what the engine sends a client that did not ask for usage, fingerprint included.
    same = [{**c, "id": got[0]["id"], "created": got[0]["created"]} for c in direct]
    assert got == same
    assert got[-1]["system_fingerprint"] == "fp_engine"
    after = counters(proxy_for)
    assert (after[0] - before[0], after[1] - before[1]) == (5, 4)


@pytest.mark.parametrize("continuous", [False, True])
def test_a_client_that_asked_for_usage_gets_it_unchanged_and_is_counted_once(
        proxy_for: ProxyProc, engine: str, continuous: bool) -> None:
    body = {"model": "sim-model", "max_tokens": 3, "stream": True, "prompt": PROMPT,
            "stream_options": {"include_usage": True, "continuous_usage_stats": continuous}}
    before = counters(proxy_for)
    got = chunks(exchange(proxy_for.url, "POST", "/v1/completions", body).body)
    assert got[-1]["choices"] == []
    assert got[-1]["usage"] == {"prompt_tokens": 5, "total_tokens": 8, "completion_tokens": 3}
    assert all(("usage" in c) is (continuous or not c["choices"]) for c in got)
    after = counters(proxy_for)
    assert (after[0] - before[0], after[1] - before[1]) == (5, 3)


def test_non_streamed_usage_is_counted_in_either_spelling(proxy_for: ProxyProc) -> None:
    before = counters(proxy_for)
    answer = exchange(proxy_for.url, "POST", "/v1/completions",
                      {"model": "sim-model", "max_tokens": 2, "prompt": PROMPT})
    assert answer.json()["usage"]["completion_tokens"] == 2
    after = counters(proxy_for)
    assert (after[0] - before[0], after[1] - before[1]) == (5, 2)
