"""A request body with an integer longer than Python reads (sys.get_int_max_str_digits(), 4300
digits: its guard against quadratic parsing) is a 400 that says so and what to send. The
proxy answered 400 "request body is not valid JSON: Exceeds the limit (4300 digits) for
integer string conversion: value has 5001 digits; use sys.set_int_max_str_digits() to
increase the limit": the JSON is valid, and the advice is for the proxy's own code, not for
its client. Raw loopback sockets; inline and in the thread (bodies over 64 KiB)."""

from __future__ import annotations

import sys

import pytest

from server.app import THREAD_BODY_BYTES
from tests.server.conftest import ProxyProc
from tests.server.hostile import exchange
from tests.server.test_local_guard import generations

LIMIT = sys.get_int_max_str_digits()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("padding", [0, THREAD_BODY_BYTES])
def test_an_integer_longer_than_python_reads_is_a_400_saying_so(
        proxy: ProxyProc, sim_url: str, path: str, padding: int) -> None:
    body = (b'{"model": "sim-model", "prompt": "hi", "messages": [{"role": "user", '
            b'"content": "%b"}], "max_tokens": 1%b}' % (b"x" * padding, b"0" * LIMIT))
    reply = exchange(proxy.url, "POST", path, {"content-type": "application/json"}, body)
    assert reply.status == 400
    error = reply.json()["error"]
    assert f"over {LIMIT} digits" in error["message"]
    assert "set_int_max_str_digits" not in error["message"]
    assert "not valid JSON" not in error["message"]
    assert generations(sim_url) == 0
