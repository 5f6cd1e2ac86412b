"""Anthropic clients get Anthropic's protocol from the proxy: its own errors and the end of a
broken stream on /v1/messages are Anthropic-shaped, checked on the wire and with the real
``anthropic`` SDK (which ignores an OpenAI-style error event and would return a truncated
message)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import pytest

from tests.server.conftest import ProxyProc, SpawnProxy, free_port, run_proxy
from tests.server.rawhttp import exchange

MESSAGE = {"model": "sim-model", "max_tokens": 8,
           "messages": [{"role": "user", "content": "a b c"}]}


def sse_events(body: bytes) -> list[tuple[str | None, str]]:
    out = []
    for block in body.decode(errors="replace").split("\n\n"):
        if not block:
            continue
        name = None
        data = ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        out.append((name, data))
    return out


def assert_anthropic_error(body: object, err_type: str) -> str:
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == err_type
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    return str(body["error"]["message"])


def client(proxy: ProxyProc, key: str = "none", **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0,
                               default_headers=headers, timeout=20)


@pytest.mark.parametrize("fault", ["kill-after=3", "garbage-after=3", "stall-after=3",
                                   "end-after=3"])
def test_a_broken_messages_stream_ends_with_an_anthropic_error_event(
        proxy: ProxyProc, fault: str) -> None:
    answer = exchange(proxy.url, "POST", "/v1/messages", {**MESSAGE, "stream": True},
                      {"x-sim-fault": fault})
    assert answer.status == 200
    events = sse_events(answer.body)
    assert [n for n, _ in events[:3]] == ["message_start", "content_block_start",
                                         "content_block_delta"]
    name, data = events[-1]
    assert name == "error"
    assert_anthropic_error(json.loads(data), "timeout_error" if "stall" in fault else
                           "api_error")
    assert "[DONE]" not in answer.body.decode(errors="replace")
    assert b'data: {"error"' not in answer.body


@pytest.mark.parametrize("fault", ["kill-after=3", "stall-after=3", "end-after=3"])
def test_the_anthropic_sdk_raises_on_a_broken_stream(proxy: ProxyProc, fault: str) -> None:
    sdk = client(proxy, **{"x-sim-fault": fault})
    texts: list[str] = []

    def read() -> None:
        with sdk.messages.stream(**MESSAGE) as stream:  # type: ignore[arg-type]
            texts.extend(stream.text_stream)

    with pytest.raises(anthropic.APIStatusError):
        read()
    assert texts  # it did stream before the engine broke off


def test_the_anthropic_sdk_reads_a_whole_stream_through_the_proxy(proxy: ProxyProc) -> None:
    with client(proxy).messages.stream(**MESSAGE) as stream:  # type: ignore[arg-type]
        message = stream.get_final_message()
    assert message.content[0].text == " tok" * 8  # type: ignore[union-attr]
    assert message.stop_reason == "max_tokens"


def test_engine_down_is_an_anthropic_503_before_the_stream(spawn_proxy: SpawnProxy) -> None:
    proxy = spawn_proxy([f"http://127.0.0.1:{free_port()}"])
    for stream in (False, True):
        answer = exchange(proxy.url, "POST", "/v1/messages?beta=true",
                          {**MESSAGE, "stream": stream})
        assert answer.status == 503
        assert answer.headers[b"retry-after"]
        assert_anthropic_error(answer.json(), "overloaded_error")
    with pytest.raises(anthropic.InternalServerError):
        client(proxy).messages.create(**MESSAGE)  # type: ignore[call-overload]
    # The OpenAI routes keep OpenAI's shape.
    other = exchange(proxy.url, "POST", "/v1/chat/completions", {**MESSAGE, "stream": True})
    assert other.status == 503
    assert set(other.json()) == {"error"}


@pytest.fixture(scope="module")
def _keyed(_shared_sim: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    """One keyed proxy for the module's key tests (a proxy start is ~1 s; they hold no state)."""
    with run_proxy([_shared_sim], "--api-key", "sk-right",
                   log_dir=tmp_path_factory.mktemp("keyed")) as proxy:
        yield proxy


@pytest.fixture
def keyed(_keyed: ProxyProc, sim_url: str) -> ProxyProc:
    """The keyed proxy in front of the shared sim, reset for each test as `sim_url` is."""
    return _keyed


@pytest.mark.parametrize("headers", [{}, {"x-api-key": "sk-wrong"},
                                     {"authorization": "Bearer sk-wrong"}])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages?beta=true",
                                  "/v1/messages/count_tokens"])
def test_401_on_anthropic_routes_is_anthropic_shaped_and_names_x_api_key(
        keyed: ProxyProc, headers: dict[str, str], path: str) -> None:
    answer = exchange(keyed.url, "POST", path, MESSAGE, headers)
    assert answer.status == 401
    message = assert_anthropic_error(answer.json(), "authentication_error")
    assert "x-api-key" in message
    assert "sk-" not in answer.body.decode()


@pytest.mark.parametrize("headers", [{"x-api-key": "sk-right"},
                                     {"authorization": "Bearer sk-right"}])
def test_the_key_is_taken_from_x_api_key_or_bearer(keyed: ProxyProc,
                                                   headers: dict[str, str]) -> None:
    answer = exchange(keyed.url, "POST", "/v1/messages", MESSAGE, headers)
    assert answer.status == 200
    assert answer.json()["type"] == "message"


def test_the_anthropic_sdk_sees_authentication_errors(keyed: ProxyProc) -> None:
    with pytest.raises(anthropic.AuthenticationError) as info:
        client(keyed, key="sk-wrong").messages.create(**MESSAGE)  # type: ignore[call-overload]
    assert "x-api-key" in str(info.value)
    message = client(keyed, key="sk-right").messages.create(**MESSAGE)  # type: ignore[call-overload]
    assert message.usage.output_tokens == 8


def test_a_body_over_the_limit_on_messages_is_an_anthropic_413(spawn_proxy: SpawnProxy,
                                                               sim_url: str) -> None:
    proxy = spawn_proxy([sim_url], "--max-body-bytes", "1000")
    big = {**MESSAGE, "messages": [{"role": "user", "content": "x " * 1000}]}
    answer = exchange(proxy.url, "POST", "/v1/messages", big)
    assert answer.status == 413
    assert_anthropic_error(answer.json(), "request_too_large")
