"""Several engine replicas: least outstanding requests, prefix affinity, and a failed replica
taken out of routing and put back."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.router import Router, affinity_key
from simengine.engine import SimConfig, spawn, spawn_process
from tests.server.conftest import SpawnProxy, post_json, sim_control, sim_stats, wait_for


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[str, str]]:
    with spawn(SimConfig(ttft=0.01, itl=0.002)) as a, spawn(SimConfig(ttft=0.01, itl=0.002)) as b:
        yield a, b


@pytest.fixture
def sims(pair: tuple[str, str]) -> tuple[str, str]:
    for url in pair:
        sim_control(url, fault="", healthy=True, health_delay=0, refuse=0, ttft=0.01,
                    itl=0.002, hold=False)
        post_json(url + "/sim/reset", {})
    return pair


def generations(url: str) -> int:
    return int(sim_stats(url)["generations"])


def chat(conversation: str, turn: int) -> dict[str, object]:
    return {"model": "sim-model", "max_tokens": 2, "messages": [
        {"role": "system", "content": f"you help with {conversation}"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": f"follow-up {turn}"}]}


def test_a_conversation_stays_on_one_replica(spawn_proxy: SpawnProxy,
                                             sims: tuple[str, str]) -> None:
    p = spawn_proxy(list(sims))
    for conversation in ("repo-a", "repo-b", "repo-c", "repo-d"):
        before = [generations(u) for u in sims]
        for turn in range(5):
            assert httpx.post(p.url + "/v1/chat/completions",
                              json=chat(conversation, turn)).status_code == 200
        added = sorted(generations(u) - b for u, b in zip(sims, before, strict=True))
        assert added == [0, 5]


def test_concurrent_load_spreads_to_the_least_busy(spawn_proxy: SpawnProxy,
                                                   sims: tuple[str, str]) -> None:
    p = spawn_proxy(list(sims), "--affinity-slack", "0")
    # the engines hold all eight in flight at once, however slow the machine, then let go
    for url in sims:
        sim_control(url, hold=True)
    threads = [threading.Thread(target=httpx.post, args=(p.url + "/v1/completions",),
                                kwargs={"json": {"prompt": f"distinct {i}", "max_tokens": 1},
                                        "timeout": 30}) for i in range(8)]
    for t in threads:
        t.start()
    assert wait_for(lambda: sum(sim_stats(u)["running"] for u in sims) == 8)
    for url in sims:
        sim_control(url, hold=False)
    for t in threads:
        t.join()
    assert [generations(u) for u in sims] == [4, 4]


def test_failed_replica_is_taken_out_and_put_back(spawn_proxy: SpawnProxy,
                                                  sims: tuple[str, str]) -> None:
    a, b = sims
    p = spawn_proxy([a, b], "--affinity-slack", "0")
    sim_control(a, healthy=False)
    down = f'toposerve_upstream_up{{upstream="{a}"}} 0.0'
    up = f'toposerve_upstream_up{{upstream="{a}"}} 1.0'
    assert wait_for(lambda: down in httpx.get(p.url + "/metrics").text)
    for prompt in prompts_preferring(a, [a, b], "p", 6):
        assert httpx.post(p.url + "/v1/completions",
                          json={"prompt": prompt, "max_tokens": 1}).status_code == 200
    assert generations(a) == 0
    assert httpx.get(p.url + "/ready").json()["ready"] is True
    sim_control(a, healthy=True)
    assert wait_for(lambda: up in httpx.get(p.url + "/metrics").text)
    # prompts whose affinity points at `a`: fixed prompts would reach it only by luck of the
    # ports (all six hashed to `b` once in CI), and once `a` is back every one must go there
    for prompt in prompts_preferring(a, [a, b], "q", 6):
        assert httpx.post(p.url + "/v1/completions",
                          json={"prompt": prompt, "max_tokens": 1}).status_code == 200
    assert generations(a) == 6


def prompts_preferring(url: str, urls: list[str], prefix: str, n: int) -> list[str]:
    """n completion prompts whose prefix affinity points at `url` among `urls`. With
    --affinity-slack 0 a request on an idle proxy goes where its affinity points, and that is a
    hash of the prompt and the replicas' URLs, whose ports are random: fixed prompts would reach
    a given replica only by luck of the ports."""
    router = Router(urls, slack=0)
    found: list[str] = []
    for i in itertools.count():
        prompt = f"{prefix}{i}"
        up = router.pick(affinity_key({"prompt": prompt, "max_tokens": 1}))
        if up is not None and up.url == url:
            found.append(prompt)
            if len(found) == n:
                return found
    raise AssertionError("unreachable")


def test_unreachable_replica_is_skipped_at_once(spawn_proxy: SpawnProxy,
                                                sims: tuple[str, str]) -> None:
    _, b = sims
    with spawn_process(SimConfig(ttft=0.01, itl=0.002)) as (a, proc):
        # an hour between health checks: only the failed connection can take `a` out
        p = spawn_proxy([a, b], "--health-interval", "3600", "--affinity-slack", "0")
        # every prompt prefers `a`: the warm-up leaves idle pooled connections to it, and after
        # the kill each request would go to `a` if the first failure had not taken it out
        for prompt in prompts_preferring(a, [a, b], "w", 4):
            assert httpx.post(p.url + "/v1/completions",
                              json={"prompt": prompt, "max_tokens": 1}).status_code == 200
        assert generations(a) == 4
        proc.kill()
        proc.wait()
        before = generations(b)
        codes = [httpx.post(p.url + "/v1/completions",
                            json={"prompt": prompt, "max_tokens": 1}).status_code
                 for prompt in prompts_preferring(a, [a, b], "r", 6)]
    assert codes == [200] * 6
    assert generations(b) == before + 6
    connect_errors = f'toposerve_upstream_errors_total{{kind="connect",upstream="{a}"}} 1.0'
    assert connect_errors in httpx.get(p.url + "/metrics").text


# -- the pure router -------------------------------------------------------------------------


def test_router_prefers_affinity_within_slack() -> None:
    r = Router(["http://a", "http://b"], slack=2)
    key = b"conversation"
    first = r.pick(key)
    assert first is not None
    first.outstanding = 2
    assert r.pick(key) is first
    first.outstanding = 3
    other = r.pick(key)
    assert other is not None
    assert other is not first


def test_router_skips_down_and_excluded() -> None:
    r = Router(["http://a", "http://b"])
    a, b = r.upstreams
    a.up = False
    assert r.pick(None) is b
    assert r.pick(None, exclude=[b]) is None


@pytest.mark.parametrize(("body", "same_as"), [
    ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                   {"role": "user", "content": "later"}]}, True),
    ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "other"}]},
     False),
])
def test_affinity_key_is_the_conversation_head(body: dict[str, object], same_as: bool) -> None:
    base = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    assert (affinity_key(body) == affinity_key(base)) is same_as


def test_a_slow_health_answer_takes_the_engine_out_only_when_it_repeats(
        spawn_proxy: SpawnProxy, sims: tuple[str, str]) -> None:
    a, _ = sims
    p = spawn_proxy([a], "--health-interval", "0.2")
    sim_control(a, health_delay=2.5)  # over the proxy's 2 s health timeout
    down = f'toposerve_upstream_up{{upstream="{a}"}} 0.0'
    assert not wait_for(lambda: down in httpx.get(p.url + "/metrics").text, timeout=3.0)
    r = httpx.post(p.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert r.status_code == 200
    assert wait_for(lambda: down in httpx.get(p.url + "/metrics").text, timeout=6.0)


# -- replicas of different models -----------------------------------------------------------


@pytest.fixture(scope="module")
def two_models() -> Iterator[tuple[str, str]]:
    with spawn(SimConfig(ttft=0.01, itl=0.002, model="coder-a")) as a, \
            spawn(SimConfig(ttft=0.01, itl=0.002, model="chat-b")) as b:
        yield a, b


def test_each_model_reaches_the_replica_that_serves_it(spawn_proxy: SpawnProxy,
                                                       two_models: tuple[str, str]) -> None:
    a, b = two_models
    for url in two_models:
        sim_control(url, healthy=True)
        post_json(url + "/sim/reset", {})
    p = spawn_proxy([a, b], "--affinity-slack", "0")
    listed = httpx.get(p.url + "/v1/models").json()
    assert sorted(m["id"] for m in listed["data"]) == ["chat-b", "coder-a"]  # both, not one's
    for i in range(6):
        for model in ("coder-a", "chat-b"):
            r = httpx.post(p.url + "/v1/completions",
                           json={"model": model, "prompt": f"p{i}", "max_tokens": 1})
            assert r.status_code == 200, r.text
        r = httpx.post(p.url + "/v1/chat/completions", json={
            "model": "chat-b", "max_tokens": 1, "messages": [{"role": "user", "content": f"{i}"}]})
        assert r.status_code == 200, r.text
        # a relayed route too: Anthropic's /v1/messages names its model in the body
        r = httpx.post(p.url + "/v1/messages", headers={"anthropic-version": "2023-06-01"},
                       json={"model": "coder-a", "max_tokens": 1,
                             "messages": [{"role": "user", "content": f"m{i}"}]})
        assert r.status_code == 200, r.text
    assert (generations(a), generations(b)) == (12, 12)
    # the replica of chat-b down: its requests wait for it (503), never the other model's
    sim_control(b, healthy=False)
    down = f'toposerve_upstream_up{{upstream="{b}"}} 0.0'
    assert wait_for(lambda: down in httpx.get(p.url + "/metrics").text)
    r = httpx.post(p.url + "/v1/completions", json={"model": "chat-b", "prompt": "x",
                                                     "max_tokens": 1})
    assert r.status_code == 503
    assert r.json()["error"]["type"]
    assert httpx.post(p.url + "/v1/completions", json={"model": "coder-a", "prompt": "x",
                                                       "max_tokens": 1}).status_code == 200
    assert generations(b) == 12
    sim_control(b, healthy=True)


def test_the_pure_router_narrows_to_the_replicas_listing_a_model() -> None:
    r = Router(["http://a", "http://b", "http://c"], slack=0)
    a, b, c = r.upstreams
    a.models, b.models = frozenset({"m1"}), frozenset({"m2"})  # c not read yet
    assert r.serves_several_models
    assert all(r.pick(None, model="m2") is b for _ in range(4))
    assert r.pick(None, model="unlisted") is not None  # any: the engine answers 404 itself
    b.up = False
    assert r.pick(None, model="m2") is None  # its only replica is down: 503, not m1's engine
    assert r.pick(None) in (a, c)


class _ListingPool:
    def __init__(self, status: int, body: bytes) -> None:
        self.answer = (status, body)

    async def get(self, target: str, limit: int | None = None) -> tuple[int, bytes]:
        return self.answer


@settings(max_examples=200, deadline=None)
@given(status=st.sampled_from([200, 404, 500]),
       body=st.binary(max_size=60) | st.recursive(
           st.none() | st.booleans() | st.integers() | st.text(max_size=6),
           lambda inner: st.lists(inner, max_size=3)
           | st.dictionaries(st.sampled_from(["data", "id", "object"]), inner, max_size=3),
           max_leaves=12).map(lambda v: json.dumps(v).encode())
       | st.just(b"[" * 100_000))
def test_any_model_list_an_engine_answers_is_read_or_unreadable(status: int, body: bytes) -> None:
    import asyncio

    from server.health import model_entries

    entries = asyncio.run(model_entries(_ListingPool(status, body), 1.0))  # type: ignore[arg-type]
    assert entries is None or all(isinstance(e["id"], str) for e in entries)
