"""The engines' prefix-cache counters at the proxy's /metrics (server/enginestats.py): read
from any exposition text without failing, shared between concurrent scrapes, kept while an
engine cannot be read."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from server.enginestats import EngineCacheStats, prefix_cache_counters

VLLM_TEXT = (
    "# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.\n"
    "# TYPE vllm:prefix_cache_queries counter\n"
    'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0\n'
    'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 300.0\n'
    "# TYPE vllm:prefix_cache_hits counter\n"
    'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 640.0\n'
    'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
)


def test_counters_are_summed_over_the_engines_label_sets() -> None:
    assert prefix_cache_counters(VLLM_TEXT) == {"queries": 1500.0, "hits": 640.0}


def test_text_without_the_counters_gives_none() -> None:
    assert prefix_cache_counters("") is None
    assert prefix_cache_counters('vllm:num_requests_running{engine="0"} 1\n') is None


def test_a_malformed_counter_line_is_skipped_not_fatal() -> None:
    text = VLLM_TEXT + ('vllm:prefix_cache_hits_total{engine="2" 99\n'
                        "vllm:prefix_cache_hits_total x\n")
    assert prefix_cache_counters(text) == {"queries": 1500.0, "hits": 640.0}


@given(st.text())
def test_any_text_is_read_without_an_exception(text: str) -> None:
    got = prefix_cache_counters(text)
    assert got is None or (set(got) == {"queries", "hits"} and min(got.values()) >= 0)


@given(st.text(), st.sampled_from(["\n", "\r\n"]), st.integers(0, 2**40))
def test_the_counters_survive_any_surrounding_lines(noise: str, newline: str, value: int) -> None:
    noise = noise.replace("vllm:prefix_cache_", "")  # the noise must not hold counters itself
    lines = [*noise.splitlines(), f'vllm:prefix_cache_queries_total{{engine="0"}} {value}',
             *noise.splitlines()]
    got = prefix_cache_counters(newline.join(lines))
    assert got is not None
    assert got["queries"] == value
    assert got["hits"] == 0


def test_concurrent_scrapes_share_one_read_of_each_engine() -> None:
    stats = EngineCacheStats(min_interval_s=0.0)
    reads: list[str] = []

    async def fetch(url: str) -> str | None:
        reads.append(url)
        await asyncio.sleep(0.05)
        return VLLM_TEXT

    async def scrapes() -> None:
        await asyncio.gather(*(stats.refresh(["http://a", "http://b"], fetch) for _ in range(50)))

    asyncio.run(scrapes())
    assert sorted(reads) == ["http://a", "http://b"]


def test_an_engine_that_cannot_be_read_keeps_its_last_counters() -> None:
    stats = EngineCacheStats(min_interval_s=0.0)
    answers: list[str | None] = [VLLM_TEXT, None, "not metrics at all"]

    async def fetch(url: str) -> str | None:
        return answers.pop(0)

    for _ in range(3):
        asyncio.run(stats.refresh(["http://a"], fetch))
    registry = CollectorRegistry()
    registry.register(stats)
    samples = {(s.name, s.labels["upstream"]): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode())
               for s in f.samples}
    assert samples == {("toposerve_engine_prefix_cache_queries_total", "http://a"): 1500.0,
                       ("toposerve_engine_prefix_cache_hits_total", "http://a"): 640.0}


def test_nothing_is_exported_before_an_engine_was_read() -> None:
    registry = CollectorRegistry()
    registry.register(EngineCacheStats())
    assert b"toposerve_engine_prefix_cache" not in generate_latest(registry)


def test_a_flood_of_scrapes_reads_the_engines_at_most_once_per_interval() -> None:
    stats = EngineCacheStats(min_interval_s=60.0)
    reads: list[str] = []

    async def fetch(url: str) -> str | None:
        reads.append(url)
        return VLLM_TEXT

    async def flood() -> None:
        for _ in range(200):  # one after another, each after the last read has ended
            await stats.refresh(["http://a"], fetch)

    asyncio.run(flood())
    assert reads == ["http://a"]
