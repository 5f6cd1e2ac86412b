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


@given(cuts=st.lists(st.integers(0, len(STREAM + END)), max_size=8), ended=st.booleans(),
       line_end=st.sampled_from([b"\n", b"\r\n", b"\r"]))
def test_the_terminal_event_is_found_however_the_stream_is_split(
        cuts: list[int], ended: bool, line_end: bytes) -> None:
    from server.dialects import RESPONSES, TerminalEvents

    body = STREAM + END if ended else STREAM  # a model's text naming the event does not count
    body = body.replace(b"\n", line_end)  # SSE allows CR, LF and CRLF line ends
    watch = TerminalEvents(RESPONSES.TERMINAL)
    points = sorted({c for c in cuts if c <= len(body)})
    for start, stop in zip([0, *points], [*points, len(body)], strict=True):
        watch.feed(body[start:stop])
    assert watch.seen is ended


@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=6))
def test_terminal_events_are_only_event_lines_with_the_name_whole(
        data: bytes, cuts: list[int]) -> None:
    from server.dialects import TerminalEvents

    # The reference: split the whole stream into lines (CR, LF, CRLF) and look at each.
    lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")[:-1]
    expected = any(ln.startswith(b"event:") and ln[6:].removeprefix(b" ") == b"message_stop"
                   for ln in lines)
    watch = TerminalEvents((b"message_stop",))
    points = sorted({c for c in cuts if c <= len(data)})
    for start, stop in zip([0, *points], [*points, len(data)], strict=True):
        watch.feed(data[start:stop])
    assert watch.seen is expected
