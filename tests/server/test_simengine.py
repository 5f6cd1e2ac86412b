"""The simulated engine: exact timings, vLLM's stream shape, token counts, and its faults."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from simengine.client import stream
from simengine.engine import SimConfig, SimEngine, build_app, spawn
from simengine.faults import Fault, FaultSpecError, parse_fault
from simengine.tokens import messages_token_ids, prompt_token_ids
from tests.server import virtual_clock
from tests.server.conftest import sim_stats, wait_for


def events(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]


TTFT, ITL = 0.08, 0.012


async def _timed_stream(port: int, body: dict[str, object]) -> list[float]:
    """The loop-clock instant of each token event of one streamed completion."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json"
                 b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(data), data))
    times: list[float] = []
    seen = b""
    while b"data: [DONE]" not in seen:
        got = await reader.read(65536)
        if not got:
            break
        times += [loop.time()] * got.count(b"data: {")
        seen = seen[-16:] + got
    writer.close()
    return times


async def _streams_on_a_virtual_clock(
    n: int, tokens: int, stall_at: float | None = None, stall_s: float = 0.0
) -> tuple[float, list[list[float]]]:
    """n concurrent streams from an in-process engine, on the virtual clock: (t0, token times)."""
    from tests.server.virtual_clock import VirtualClockLoop

    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    engine = build_app(SimConfig(ttft=TTFT, itl=ITL))
    server = await loop.create_server(engine.protocol_factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    t0 = loop.time()
    if stall_at is not None:
        loop.call_at(t0 + stall_at, loop.stall, stall_s)
    body = {"prompt": "x", "max_tokens": tokens, "ignore_eos": True, "stream": True}
    try:
        times = await asyncio.gather(*(_timed_stream(port, body) for _ in range(n)))
    finally:
        server.close()
    return t0, list(times)


def test_tokens_are_written_on_their_absolute_deadlines() -> None:
    # Timing claims (how late a loaded machine writes them) are measured by
    # benchmarks/loadgen_accuracy.py (the simulator's lateness column); here, what is scheduled.
    t0, [times] = virtual_clock.run(_streams_on_a_virtual_clock(1, 40))
    assert times == pytest.approx([t0 + TTFT + k * ITL for k in range(40)], abs=1e-9)


def test_many_concurrent_streams_stay_drift_free() -> None:
    # 64 streams, and the engine paused 30 ms mid-way: after it, each stream's tokens are on
    # their own deadlines again, none carrying the pause.
    stall_at, stall_s = TTFT + 5.5 * ITL, 0.03
    t0, streams = virtual_clock.run(_streams_on_a_virtual_clock(64, 30, stall_at, stall_s))
    resumed = t0 + stall_at + stall_s
    want = [max(t0 + TTFT + k * ITL, resumed) if k > 5 else t0 + TTFT + k * ITL
            for k in range(30)]
    assert len(streams) == 64
    for times in streams:
        assert times == pytest.approx(want, abs=1e-9)


def test_a_stalled_engine_catches_up_instead_of_drifting() -> None:
    # The process stops for 50 ms after token 10 (as the OS may pause it): the tokens due then
    # go out together when it resumes, and every later token is back on its own deadline, not
    # 50 ms behind it (a sleep per token would carry the delay to the end).
    stall_at, stall_s = TTFT + 10.5 * ITL, 0.05
    t0, streams = virtual_clock.run(_streams_on_a_virtual_clock(8, 30, stall_at, stall_s))
    resumed = t0 + stall_at + stall_s
    want = [max(t0 + TTFT + k * ITL, resumed) if k > 10 else t0 + TTFT + k * ITL
            for k in range(30)]
    for times in streams:
        assert times == pytest.approx(want, abs=1e-9)
    late = [k for k in range(30) if want[k] == resumed]
    assert late == [11, 12, 13, 14]  # the four due while it was stopped
    assert times[-1] == pytest.approx(t0 + TTFT + 29 * ITL, abs=1e-9)


HELD_BODY = {"prompt": "x", "max_tokens": 5, "ignore_eos": True, "stream": True}


async def _holding_engine() -> tuple[SimEngine, asyncio.Server, int, float]:
    """A simulated engine holding its generations, served on the virtual clock's loop: (the
    engine, its server, its port, the loop's time now)."""
    from tests.server.virtual_clock import VirtualClockLoop

    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    engine = build_app(SimConfig(ttft=TTFT, itl=ITL))
    engine.hold(True)
    server = await loop.create_server(engine.protocol_factory, "127.0.0.1", 0)
    return engine, server, server.sockets[0].getsockname()[1], loop.time()


async def _held_streams_on_a_virtual_clock(n: int, release_at: float
                                           ) -> tuple[float, list[list[float]]]:
    """n streams sent while the engine holds, let go ``release_at`` s later: (t0, token times)."""
    engine, server, port, t0 = await _holding_engine()
    asyncio.get_running_loop().call_at(t0 + release_at, engine.hold, False)
    body = HELD_BODY
    try:
        times = await asyncio.gather(*(_timed_stream(port, body) for _ in range(n)))
    finally:
        server.close()
    return t0, list(times)


def test_held_generations_start_when_let_go_and_not_before() -> None:
    # /sim/control's hold: no token while held, however long; then each stream's tokens on
    # their deadlines counted from the release, as if sent at that instant
    t0, streams = virtual_clock.run(_held_streams_on_a_virtual_clock(4, 1.0))
    for times in streams:
        assert times == pytest.approx([t0 + 1.0 + TTFT + k * ITL for k in range(5)], abs=1e-9)


async def _let_go_then_held_on_a_virtual_clock() -> tuple[float, list[float], list[float]]:
    """A stream sent while the engine holds, let go at 1 s with the hold kept on; a second one
    sent at 2 s, held until the hold ends at 3 s: (t0, each one's token times)."""
    engine, server, port, t0 = await _holding_engine()
    loop = asyncio.get_running_loop()
    loop.call_at(t0 + 1.0, engine.let_go)
    loop.call_at(t0 + 3.0, engine.hold, False)
    body = HELD_BODY

    async def later() -> list[float]:
        await asyncio.sleep(2.0)
        return await _timed_stream(port, body)

    try:
        first, second = await asyncio.gather(_timed_stream(port, body), later())
    finally:
        server.close()
    return t0, first, second


def test_let_go_starts_the_held_generations_and_keeps_holding_the_next_ones() -> None:
    t0, first, second = virtual_clock.run(_let_go_then_held_on_a_virtual_clock())
    assert first == pytest.approx([t0 + 1.0 + TTFT + k * ITL for k in range(5)], abs=1e-9)
    assert second == pytest.approx([t0 + 3.0 + TTFT + k * ITL for k in range(5)], abs=1e-9)


@pytest.mark.parametrize(("chat", "usage"), [(True, True), (True, False), (False, True),
                                             (False, False)])
def test_stream_has_vllm_shape(sim_url: str, chat: bool, usage: bool) -> None:
    body: dict[str, object] = {"max_tokens": 3, "stream": True,
                               "stream_options": {"include_usage": usage}}
    if chat:
        body["messages"] = [{"role": "user", "content": "one two three four"}]
    else:
        body["prompt"] = "one two three four"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    r = httpx.post(sim_url + path, json=body)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    evs = events(r.text)
    assert evs[-1] == "[DONE]"
    chunks = [json.loads(e) for e in evs[:-1]]
    if usage:
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 3,
                                       "total_tokens": 7}
        chunks = chunks[:-1]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    if chat:
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert [c["choices"][0]["delta"]["content"] for c in chunks[1:]] == [" tok"] * 3
    else:
        assert [c["choices"][0]["text"] for c in chunks] == [" tok"] * 3


def test_non_streamed_answer_carries_usage(sim_url: str) -> None:
    r = httpx.post(sim_url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 2})
    assert r.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert r.json()["choices"][0]["text"] == " tok tok"


@pytest.mark.parametrize(("prompt", "count"), [("", 0), ("a", 1), ("a  b\tc\n", 3),
                                                ([1, 2, 3, 4], 4), (["x y"], 2)])
def test_prompt_tokens_are_deterministic(sim_url: str, prompt: object, count: int) -> None:
    assert len(prompt_token_ids(prompt)) == count
    r = httpx.post(sim_url + "/tokenize", json={"prompt": prompt})
    assert r.json()["count"] == count
    assert r.json()["tokens"] == prompt_token_ids(prompt)
    assert set(r.json()) >= {"count", "max_model_len", "tokens"}


def test_chat_tokens_count_the_words_of_every_message() -> None:
    msgs = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi there you"}]}]
    assert len(messages_token_ids(msgs)) == 5


def test_eos_after_stops_early_unless_ignore_eos() -> None:
    with spawn(SimConfig(ttft=0.0, itl=0.0, eos_after=2)) as url:
        stopped = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 5})
        full = httpx.post(url + "/v1/completions",
                          json={"prompt": "x", "max_tokens": 5, "ignore_eos": True})
        forced = httpx.post(url + "/v1/completions",
                            json={"prompt": "x", "max_tokens": 5, "min_tokens": 4})
    assert stopped.json()["usage"]["completion_tokens"] == 2
    assert stopped.json()["choices"][0]["finish_reason"] == "stop"
    assert full.json()["usage"]["completion_tokens"] == 5
    assert forced.json()["usage"]["completion_tokens"] == 4


def test_metrics_use_vllm_names(sim_url: str) -> None:
    httpx.post(sim_url + "/v1/completions", json={"prompt": "a b", "max_tokens": 3})
    text = httpx.get(sim_url + "/metrics").text
    assert 'vllm:prompt_tokens_total{engine="0",model_name="sim-model"} 2.0' in text
    assert 'vllm:generation_tokens_total{engine="0",model_name="sim-model"} 3.0' in text
    assert "vllm:num_requests_running{" in text


@pytest.mark.parametrize(("spec", "fault"), [
    ("", Fault()),
    ("kill-after=3", Fault(kill_after=3)),
    ("stall-after=0, status=503", Fault(stall_after=0, status=503)),
    ("garbage", Fault(garbage_after=0)),
    ("header-delay=0.5,close", Fault(header_delay=0.5, close=True)),
])
def test_fault_specs_parse(spec: str, fault: Fault) -> None:
    assert parse_fault(spec) == fault


@pytest.mark.parametrize("spec", ["explode", "kill-after=x", "stall-after=-1"])
def test_bad_fault_specs_are_refused(spec: str) -> None:
    with pytest.raises(FaultSpecError):
        parse_fault(spec)


def test_kill_after_breaks_the_stream(sim_url: str) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(sim_url + "/v1/completions", headers={"x-sim-fault": "kill-after=2"},
                   json={"prompt": "x", "max_tokens": 5, "stream": True})
    assert sim_stats(sim_url)["killed"] == 1


def test_status_fault_answers_openai_error(sim_url: str) -> None:
    r = httpx.post(sim_url + "/v1/completions", headers={"x-sim-fault": "status=503,retry-after=7"},
                   json={"prompt": "x"})
    assert r.status_code == 503
    assert r.headers["retry-after"] == "7"
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_garbage_is_not_sse(sim_url: str) -> None:
    r = httpx.post(sim_url + "/v1/completions", headers={"x-sim-fault": "garbage-after=1"},
                   json={"prompt": "x", "max_tokens": 3, "stream": True})
    evs = events(r.text)
    assert "[DONE]" not in evs
    with pytest.raises(json.JSONDecodeError):
        json.loads(evs[1])


def test_client_disconnect_counts_as_aborted(sim_url: str) -> None:
    with httpx.stream("POST", sim_url + "/v1/completions",
                      json={"prompt": "x", "max_tokens": 1000, "stream": True}) as r:
        next(r.iter_raw())
    assert wait_for(lambda: sim_stats(sim_url)["aborted"] == 1)
    assert sim_stats(sim_url)["running"] == 0


def test_stall_keeps_the_connection_silent(sim_url: str) -> None:
    with pytest.raises(httpx.ReadTimeout), httpx.stream(
            "POST", sim_url + "/v1/completions", headers={"x-sim-fault": "stall-after=1"},
            json={"prompt": "x", "max_tokens": 5, "stream": True}, timeout=0.5) as r:
        for _ in r.iter_raw():
            pass
    assert sim_stats(sim_url)["stalled"] == 1


def test_refuse_closes_new_connections(sim_url: str) -> None:
    httpx.post(sim_url + "/sim/control", json={"refuse": 0.5})
    host, port = sim_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=2) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        try:
            data = sock.recv(100)
        except ConnectionResetError:
            data = b""
    assert data == b""
    assert wait_for(lambda: _healthy(sim_url), timeout=15)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health").status_code == 200
    except httpx.HTTPError:
        return False


def _sse_json(text: str) -> list[dict[str, object]]:
    """The JSON of every data line, whether or not its event has an ``event:`` line."""
    return [json.loads(line[6:]) for line in text.split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.fixture(scope="module")
def spaced_sim() -> Iterator[str]:
    with spawn(SimConfig(ttft=0.0, itl=0.0, spaced_json=True, fingerprint="fp_sim")) as url:
        yield url


@pytest.mark.parametrize("usage", [False, True])
def test_spaced_engine_writes_default_json_and_places_the_fingerprint_as_vllm(
        spaced_sim: str, usage: bool) -> None:
    body = {"messages": [{"role": "user", "content": "a b"}], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": usage}}
    text = httpx.post(spaced_sim + "/v1/chat/completions", json=body).text
    assert '"choices": [' in text
    assert '"choices":[' not in text
    chunks = _sse_json(text)
    stamped = [c for c in chunks if "system_fingerprint" in c]
    assert len(stamped) == 1
    assert stamped[0]["system_fingerprint"] == "fp_sim"
    # vLLM: on the usage chunk when usage is asked for, else on the chunk that ends the choice.
    assert stamped[0]["choices"] == [] if usage else stamped[0] is chunks[-1]


def test_continuous_usage_needs_include_usage_as_in_vllm(sim_url: str) -> None:
    def chunks(options: dict[str, bool]) -> list[dict[str, object]]:
        body = {"prompt": "a b", "max_tokens": 3, "stream": True, "stream_options": options}
        return _sse_json(httpx.post(sim_url + "/v1/completions", json=body).text)

    assert not [c for c in chunks({"continuous_usage_stats": True}) if "usage" in c]
    every = chunks({"include_usage": True, "continuous_usage_stats": True})
    assert all("usage" in c for c in every)
    assert [c["usage"]["completion_tokens"] for c in every] == [1, 2, 3, 3]  # type: ignore[index]


def test_messages_stream_has_anthropic_events(sim_url: str) -> None:
    body = {"model": "sim-model", "max_tokens": 3, "stream": True,
            "messages": [{"role": "user", "content": "a b c"}]}
    text = httpx.post(sim_url + "/v1/messages", json=body).text
    names = [line[7:] for line in text.split("\n") if line.startswith("event: ")]
    assert names == ["message_start", "content_block_start", *["content_block_delta"] * 3,
                     "content_block_stop", "message_delta", "message_stop"]
    assert "[DONE]" not in text
    whole = httpx.post(sim_url + "/v1/messages", json={**body, "stream": False}).json()
    assert whole["content"] == [{"type": "text", "text": " tok" * 3}]
    assert whole["usage"] == {"input_tokens": 3, "output_tokens": 3}


def test_responses_stream_counts_its_sequence(sim_url: str) -> None:
    body = {"input": "a b", "max_output_tokens": 2, "stream": True}
    text = httpx.post(sim_url + "/v1/responses", json=body).text
    data = _sse_json(text)
    assert [d["type"] for d in data] == ["response.created", "response.output_text.delta",
                                         "response.output_text.delta", "response.completed"]
    assert [d["sequence_number"] for d in data] == [0, 1, 2, 3]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/messages", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 5}),
    ("/v1/responses", {"input": "a", "max_output_tokens": 5}),
])
def test_client_times_the_token_events_of_named_event_streams(
        sim_url: str, path: str, body: dict[str, object]) -> None:
    result = asyncio.run(stream(sim_url + path, {**body, "stream": True}))
    assert result.error is None
    assert result.done
    assert len(result.token_times) == 5
