"""How long the proxy reuses a pooled engine connection: 1 s less than the engine keeps an idle
one open (--upstream-keep-alive, vLLM's 5 s by default), against an in-process engine that
counts the connections it is asked for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from server.admission import Admission
from server.config import ConfigError, ProxyConfig, config_from_args
from server.metrics import ProxyMetrics
from server.relay import Call, Relay
from server.router import Router
from server.upstream import reuse_window
from tests.server.inprocess import InProcessEngine, RecordingDownstream
from topocommon import http1

ENGINE = "http://engine:8000"
BODY = b'{"id":"x","object":"text_completion","choices":[]}'


def engine() -> InProcessEngine:
    async def handler(request: bytes) -> AsyncIterator[bytes]:
        yield (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
               % (len(BODY), BODY))
    return InProcessEngine(handler)


def connections_for_two_requests(keep_alive_s: float, pause_s: float,
                                 monkeypatch: pytest.MonkeyPatch) -> int:
    """Two requests ``pause_s`` apart (on the pool's clock, which the test moves on instead of
    sleeping) through one relay: how many connections the engine saw."""
    eng = engine()
    skipped = [0.0]
    monkeypatch.setattr(http1, "time", SimpleNamespace(
        monotonic=lambda: time.monotonic() + skipped[0]))

    async def go() -> None:
        config = ProxyConfig(upstreams=(ENGINE,), upstream_keep_alive_s=keep_alive_s)
        relay = Relay(config, Router(config.upstreams), ProxyMetrics(CollectorRegistry(), {}),
                      Admission(8, 8, 1.0), connect=eng.connect)
        for n in range(2):
            if n:
                skipped[0] += pause_s
            down = RecordingDownstream()
            await relay.relay(Call(request_id=f"r{n}", method="POST", target="/v1/completions",
                                   route="/v1/completions", model="m", headers=[],
                                   body=b"{}"), down)
            assert down.status == 200
        relay.close()
    asyncio.run(go())
    return eng.connections


def test_a_connection_idle_for_less_than_the_engines_keep_alive_is_reused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 30 s idle: past the fixed 4 s the pool had before the option, within 75 s less 1
    assert connections_for_two_requests(75.0, 30.0, monkeypatch) == 1


def test_a_connection_idle_past_the_reuse_window_is_replaced_by_a_new_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert connections_for_two_requests(5.0, 4.5, monkeypatch) == 2  # vLLM's 5 s: 4 s reuse
    assert connections_for_two_requests(5.0, 3.5, monkeypatch) == 1
    assert connections_for_two_requests(0.5, 0.3, monkeypatch) == 2  # at most 0.05 s


def test_the_reuse_window_is_a_second_short_of_the_engines_keep_alive() -> None:
    assert reuse_window(5.0) == 4.0  # vLLM's default: what the proxy did before the option
    assert reuse_window(75.0) == 74.0
    assert reuse_window(0.5) == pytest.approx(0.05)  # never zero or negative


def test_the_keep_alive_option_defaults_to_vllms_and_refuses_non_positive_values() -> None:
    assert config_from_args(["--upstream", "http://127.0.0.1:8000"]).upstream_keep_alive_s == 5.0
    assert config_from_args(["--upstream", "http://127.0.0.1:8000",
                             "--upstream-keep-alive", "75"]).upstream_keep_alive_s == 75.0
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(ConfigError):
            config_from_args(["--upstream", "http://127.0.0.1:8000",
                              "--upstream-keep-alive", bad])
