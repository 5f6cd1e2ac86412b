"""Pure parts of the proxy: SSE inspection, admission, histograms, plan labels, GPU collector."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client import CollectorRegistry

from server.admission import Admission
from server.app import pick_request_id, with_usage_option
from server.config import parse_plan_info
from server.errors import ConfigError
from server.metrics import GpuCollector, ProxyMetrics
from server.sse import SseInspector
from topocommon.nvml import GpuSample

TOKEN = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}'
ROLE = b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""},"lo":1}]}'
USAGE = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}'
DONE = b"data: [DONE]"


@pytest.mark.parametrize(("reads", "strip", "forwarded", "tokens", "usage", "done"), [
    ([TOKEN + b"\n\n"], True, TOKEN + b"\n\n", 1, None, False),
    ([ROLE + b"\n\n" + TOKEN + b"\n\n"], True, ROLE + b"\n\n" + TOKEN + b"\n\n", 1, None, False),
    ([USAGE + b"\n\n", DONE + b"\n\n"], True, DONE + b"\n\n", 0, (7, 3), True),
    ([USAGE + b"\n\n" + DONE + b"\n\n"], False, USAGE + b"\n\n" + DONE + b"\n\n", 0, (7, 3),
     True),
    ([TOKEN[:10], TOKEN[10:] + b"\n\n"], True, TOKEN + b"\n\n", 1, None, False),
    ([b": keep-alive\n\n", TOKEN + b"\n\nda", b"ta: [DONE]\n\n"], True,
     b": keep-alive\n\n" + TOKEN + b"\n\n" + DONE + b"\n\n", 1, None, True),
])
def test_inspector_forwards_whole_events_and_counts(reads: list[bytes], strip: bool,
                                                    forwarded: bytes, tokens: int,
                                                    usage: tuple[int, int] | None,
                                                    done: bool) -> None:
    inspector = SseInspector(strip_usage=strip)
    scans = [inspector.feed(r) for r in reads]
    assert b"".join(s.forward for s in scans) == forwarded
    assert sum(s.tokens for s in scans) == tokens
    assert next((s.usage for s in scans if s.usage), None) == usage
    assert inspector.done is done


@pytest.mark.parametrize("garbage", [b"not sse at all\n\n", b'data: {"broken\n\n',
                                     b"data: \xff\xfe\n\n"])
def test_inspector_flags_malformed_events(garbage: bytes) -> None:
    scan = SseInspector(strip_usage=False).feed(TOKEN + b"\n\n" + garbage)
    assert scan.malformed
    assert scan.forward == TOKEN + b"\n\n"


def test_inspector_bounds_an_event_that_never_ends() -> None:
    inspector = SseInspector(strip_usage=False)
    scans = [inspector.feed(b"data: {" + b"x" * 1024 * 1024) for _ in range(5)]
    assert scans[-1].malformed


def test_admission_queues_then_refuses() -> None:
    async def scenario() -> list[bool]:
        adm = Admission(limit=1, queue=1, wait_s=0.2)
        first = await adm.acquire()
        waiting = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0)
        refused = await adm.acquire()  # queue full
        adm.release()  # the slot goes to the waiter
        queued = await waiting
        timed_out_task = asyncio.create_task(adm.acquire())
        timed_out = await timed_out_task  # nobody releases: the wait runs out
        adm.release()
        return [first, refused, queued, timed_out, adm.in_flight == 0]

    assert asyncio.run(scenario()) == [True, False, True, False, True]


def test_histogram_buckets_are_cumulative() -> None:
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry, {})
    for value in (0.004, 0.01, 0.3, 700.0):
        metrics.ttft.labels("m", "/v1/completions").observe(value)
    def get(le: str) -> float | None:
        return registry.get_sample_value("toposerve_ttft_seconds_bucket",
                                         {"model": "m", "route": "/v1/completions", "le": le})
    assert [get("0.005"), get("0.01"), get("0.3"), get("300.0"), get("+Inf")] == [1, 2, 3, 3, 4]
    assert registry.get_sample_value("toposerve_ttft_seconds_sum",
                                     {"model": "m", "route": "/v1/completions"}) == 700.314


def test_model_label_is_bounded() -> None:
    metrics = ProxyMetrics(CollectorRegistry(), {})
    labels = {metrics.model_label(f"model-{i}") for i in range(100)}
    assert len(labels) == 33
    assert "other" in labels
    assert metrics.model_label(None) == "unknown"


@pytest.mark.parametrize(("text", "labels"), [
    (None, {}),
    ('{"mode": "pp", "tp": 1, "pp": 2, "dp": 1, "gpus": [0, 1], "extra": "x"}',
     {"mode": "pp", "tp": "1", "pp": "2", "dp": "1", "engine": "", "transport": "", "model": "",
      "gpus": "0,1"}),
])
def test_plan_info_labels(text: str | None, labels: dict[str, str]) -> None:
    assert parse_plan_info(text) == labels


@pytest.mark.parametrize("text", ["[1]", "{not json"])
def test_plan_info_must_be_an_object(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_plan_info(text)


def _sample(index: int, **fields: float | None) -> GpuSample:
    base: dict[str, float | None] = {
        "utilization_ratio": 0.5, "memory_used_bytes": 1e9, "memory_total_bytes": 8e10,
        "power_watts": 300.0, "pcie_tx_bytes_per_second": 1e6, "pcie_rx_bytes_per_second": 2e6,
        "nvlink_tx_bytes_total": None, "nvlink_rx_bytes_total": None}
    base.update(fields)
    return GpuSample(index=index, name="NVIDIA H200", uuid=f"GPU-{index}", **base)  # type: ignore[arg-type]


def test_gpu_collector_exports_what_nvml_gave() -> None:
    registry = CollectorRegistry()
    registry.register(GpuCollector(lambda: [_sample(0), _sample(1, nvlink_tx_bytes_total=5e9)]))
    def get(name: str, gpu: str) -> float | None:
        return registry.get_sample_value(name, {"gpu": gpu, "name": "NVIDIA H200"})
    assert get("toposerve_gpu_utilization_ratio", "0") == 0.5
    assert get("toposerve_gpu_pcie_rx_bytes_per_second", "1") == 2e6
    assert get("toposerve_gpu_nvlink_tx_bytes_total", "1") == 5e9
    assert get("toposerve_gpu_nvlink_tx_bytes_total", "0") is None  # NVML said unknown


def test_gpu_collector_is_silent_without_gpus_or_when_nvml_fails() -> None:
    def broken() -> list[GpuSample]:
        raise RuntimeError("NVML exploded")

    for sampler in (list, broken):
        registry = CollectorRegistry()
        registry.register(GpuCollector(sampler))
        assert list(registry.collect()) == []
    default = CollectorRegistry()
    default.register(GpuCollector())  # the real NVML: a scrape never fails, GPUs or not
    assert all(m.name.startswith("toposerve_gpu_") for m in default.collect())


def test_uvicorn_fast_paths_fall_back_when_its_cycle_lacks_what_they_read() -> None:
    # The per-token direct write and the whole-body check read attributes of uvicorn's
    # RequestResponseCycle; one without them (as a renamed attribute in a later uvicorn would
    # be) must send them down the general path, not fail mid-stream.
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    from server.uvicorn_adapter import CycleWriter, cycle_body_buffered

    bare = RequestResponseCycle.__new__(RequestResponseCycle)
    assert CycleWriter.of(bare.send) is None
    assert cycle_body_buffered(bare) is False

    async def not_uvicorn(message: object) -> None:
        return None

    assert CycleWriter.of(not_uvicorn) is None  # another server: its own send


@pytest.mark.parametrize("body", [
    b'{"model":"m","prompt":"p","stream":true}',
    b'  \n{ "model" : "m", "stream": true, "messages": [{"role": "user", "content": "{"}]}',
    b"{}",
    b' { \t} ',
    '{"model":"m","prompt":"größe ✓","stream":true}'.encode(),
])
def test_usage_option_is_spliced_into_the_request_unchanged_otherwise(body: bytes) -> None:
    spliced = with_usage_option(body)
    assert spliced is not None
    assert json.loads(spliced) == {**json.loads(body),
                                   "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("body", [
    '{"model":"m","stream":true}'.encode("utf-8-sig"),
    '{"model":"m","stream":true}'.encode("utf-16"),
])
def test_usage_option_declines_bodies_that_are_not_plain_utf8(body: bytes) -> None:
    assert json.loads(body)  # json.loads takes these ...
    assert with_usage_option(body) is None  # ... the splice does not: the caller re-encodes


def test_fresh_request_ids_are_distinct_32_hex_digit_tokens() -> None:
    made = [pick_request_id("") for _ in range(1000)]
    assert len(set(made)) == 1000
    assert all(len(r) == 32 and int(r, 16) >= 0 for r in made)
    assert pick_request_id("agent-42.turn-7") == "agent-42.turn-7"
    assert pick_request_id("a b<script>") != "a b<script>"
