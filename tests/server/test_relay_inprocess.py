"""The relay against an in-process engine (tests.server.inprocess): each API dialect's
framing, terminal-event check and usage, and the engine-side HTTP rules, with no engine process.
Generated engine answers (hypothesis) check that whatever the engine's bytes, the client gets a
whole answer or an error, never an exception out of the relay."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from server.admission import Admission
from server.config import ProxyConfig
from server.metrics import ProxyMetrics
from server.relay import Call, Relay
from server.router import Router
from tests.server.inprocess import InProcessEngine, RecordingDownstream

ENGINE = "http://engine:8000"


def relay_for(engine: InProcessEngine, **cfg: object) -> tuple[Relay, CollectorRegistry]:
    config = ProxyConfig(upstreams=(ENGINE,), **cfg)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry, {})
    relay = Relay(config, Router(config.upstreams), metrics, Admission(8, 8, 1.0),
                  connect=engine.connect)
    return relay, registry


def run(engine: InProcessEngine, target: str, inspect: bool = True,
        **cfg: object) -> tuple[RecordingDownstream, CollectorRegistry, Call]:
    async def go() -> tuple[RecordingDownstream, CollectorRegistry, Call]:
        relay, registry = relay_for(engine, **cfg)
        call = Call(request_id="r1", method="POST", target=target, route=target, model="m",
                    headers=[("content-type", "application/json")], body=b"{}",
                    inspect=inspect)
        down = RecordingDownstream()
        await relay.relay(call, down)
        relay.close()
        return down, registry, call
    return asyncio.run(go())


def answer(*parts: bytes) -> InProcessEngine:
    async def handler(request: bytes) -> AsyncIterator[bytes]:
        for part in parts:
            yield part
    return InProcessEngine(handler)


def sse(*events: bytes) -> bytes:
    body = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + body)


def test_an_anthropic_stream_without_message_stop_ends_in_an_error_event() -> None:
    text = json.dumps({"type": "content_block_delta", "delta": {"text": "\nevent: message_stop"}})
    down, _, call = run(answer(sse(b"event: content_block_delta\ndata: " + text.encode()
                                   + b"\n\n")), "/v1/messages", inspect=False)
    assert down.body.endswith(b"\n\n")
    assert b"event: error\n" in down.body
    assert call.status == 503


def test_a_responses_stream_with_its_terminal_event_ends_cleanly() -> None:
    events = (b"event: response.created\ndata: {}\n\n", b"event: response.completed\ndata: {}\n\n")
    down, _, call = run(answer(sse(*events)), "/v1/responses", inspect=False)
    assert down.body == b"".join(events)
    assert (call.status, down.ended) == (200, True)


def test_an_openai_stream_counts_usage_and_strips_nothing_asked_for() -> None:
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
    token = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
    down, registry, _ = run(answer(sse(token, usage, b"data: [DONE]\n\n")),
                            "/v1/chat/completions")
    assert down.body == token + usage + b"data: [DONE]\n\n"
    assert registry.get_sample_value("toposerve_prompt_tokens_total", {"model": "m"}) == 7


def test_an_interim_answer_then_the_real_one() -> None:
    body = b'{"usage": {"prompt_tokens": 1, "completion_tokens": 1}}'
    engine = answer(b"HTTP/1.1 103 Early Hints\r\nlink: <x>\r\n\r\n",
                    b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))
    down, _, _ = run(engine, "/v1/completions")
    assert (down.status, down.body) == (200, body)
    assert all(name != b"link" for name, _ in down.headers)


@settings(max_examples=60, deadline=None)
@given(raw=st.lists(st.binary(max_size=200), max_size=6),
       target=st.sampled_from(["/v1/chat/completions", "/v1/messages", "/v1/responses"]))
def test_whatever_the_engine_sends_the_client_gets_an_answer_or_an_error(
        raw: list[bytes], target: str) -> None:
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    down, _, call = run(answer(head, *raw), target, inspect=target == "/v1/chat/completions",
                        first_byte_timeout_s=1.0, idle_timeout_s=0.2)
    assert call.status in (200, 502, 503, 504)
    assert down.status in (200, 502, 503, 504)
