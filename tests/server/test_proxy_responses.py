"""/v1/responses through the proxy with the real ``openai`` SDK: a whole stream reads whole, and
a broken one raises (the SDK reads the proxy's ``data: {"error": ...}`` event) instead of
ending as if complete."""

from __future__ import annotations

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.server.conftest import ProxyProc


def events(proxy: ProxyProc, **headers: str) -> list[str]:
    sdk = openai.OpenAI(base_url=proxy.url + "/v1", api_key="none", max_retries=0, timeout=20,
                        default_headers=headers)
    got = []
    for event in sdk.responses.create(model="sim-model", input="a b", max_output_tokens=5,
                                      stream=True):
        got.append(event.type)
    return got


def test_a_whole_responses_stream_reads_whole(proxy: ProxyProc) -> None:
    got = events(proxy)
    assert got == ["response.created", *["response.output_text.delta"] * 5,
                   "response.completed"]


# end-after: the engine ends the body cleanly, without response.completed
@pytest.mark.parametrize("fault", ["kill-after=2", "stall-after=2", "end-after=2"])
def test_a_broken_responses_stream_raises_in_the_openai_sdk(proxy: ProxyProc,
                                                            fault: str) -> None:
    with pytest.raises(openai.APIError, match="engine"):
        events(proxy, **{"x-sim-fault": fault})


STREAM = (b"event: response.created\ndata: {\"type\": \"response.created\"}\n\n"
          b"event: response.output_text.delta\n"
          b"data: {\"delta\": \"event: response.completed\"}\n\n")
END = b"event: response.completed\ndata: {\"type\": \"response.completed\"}\n\n"


@given(cuts=st.lists(st.integers(0, len(STREAM + END)), max_size=8), ended=st.booleans())
def test_the_terminal_event_is_found_however_the_stream_is_split(
        cuts: list[int], ended: bool) -> None:
    from server.relay import responses_terminal

    body = STREAM + END if ended else STREAM  # a model's text naming the event does not count
    seen, tail = False, b"\n"  # the relay's starting tail: the first event starts a line
    points = sorted({c for c in cuts if c <= len(body)})
    for start, stop in zip([0, *points], [*points, len(body)], strict=True):
        found, tail = responses_terminal(tail, body[start:stop])
        seen = seen or found
    assert seen is ended
