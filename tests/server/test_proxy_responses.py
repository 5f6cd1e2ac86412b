"""/v1/responses through the proxy with the real ``openai`` SDK: a whole stream reads whole, and
a broken one raises (the SDK reads the proxy's ``data: {"error": ...}`` event) instead of
ending as if complete."""

from __future__ import annotations

import openai
import pytest

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
