"""The 503 a client gets while the launcher keeps the engine down on purpose (a multi-node group
missing a node, or restarting) names what is wrong, in the OpenAI error format, from the file the
launcher writes (server/enginestatus.py); a real proxy, raw HTTP, no engine behind it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server import enginestatus
from server.errors import EngineGroupNodeDown, EngineGroupRestarting, UpstreamUnavailable
from tests.server.conftest import SpawnProxy, free_port
from tests.server.test_local_guard import raw

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
DOWN = "node 1 of the 2-node engine group is down; the group restarts once every node is back"


def post(url: str, path: str, body: dict[str, object]) -> tuple[int, dict[str, str], dict]:
    status, headers, parsed = raw(url, "POST", path, [("host", "127.0.0.1"),
                                                      ("content-type", "application/json")],
                                  json.dumps(body).encode())
    assert isinstance(parsed, dict), parsed
    return status, headers, parsed


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
def test_a_group_with_a_node_down_gets_a_503_naming_the_node_then_the_restart(
    spawn_proxy: SpawnProxy, tmp_path: Path, path: str
) -> None:
    status_file = tmp_path / "engine-status.json"
    status_file.write_text(json.dumps({"state": "node_down", "message": DOWN}))
    proxy = spawn_proxy([f"http://127.0.0.1:{free_port()}"], "--engine-status-file",
                        str(status_file))
    code, headers, body = post(proxy.url, path, CHAT)
    assert (code, int(headers["retry-after"])) == (503, 5)
    assert body["error"] == {
        "message": DOWN + "; retry after the Retry-After delay", "type": "server_error",
        "param": None, "code": "engine_group_node_down"}
    status_file.write_text(json.dumps({"state": "restarting", "message":
                                       "the 2-node engine group is restarting (restart 1 of 5)"}))
    code, _, body = post(proxy.url, path, CHAT)
    assert (code, body["error"]["code"]) == (503, "engine_group_restarting")
    assert body["error"]["message"].startswith("the 2-node engine group is restarting")
    status_file.write_text("{}")  # the group is whole again: the generic line, if any
    code, _, body = post(proxy.url, path, CHAT)
    assert (code, body["error"]["code"]) == (503, "engine_unavailable")
    ready = raw(proxy.url, "GET", "/ready", [("host", "127.0.0.1")])
    assert ready[0] == 503


def test_ready_says_why_too(spawn_proxy: SpawnProxy, tmp_path: Path) -> None:
    status_file = tmp_path / "s.json"
    status_file.write_text(json.dumps({"state": "node_down", "message": DOWN}))
    proxy = spawn_proxy([f"http://127.0.0.1:{free_port()}"], "--engine-status-file",
                        str(status_file))
    code, _, body = raw(proxy.url, "GET", "/ready", [("host", "127.0.0.1")])
    assert code == 503
    assert (body["code"], body["why"]) == ("engine_group_node_down",
                                           DOWN + "; retry after the Retry-After delay")


@pytest.mark.parametrize(("raw_text", "kind"), [
    (b'{"state": "node_down", "message": "node 2 of 3 is down"}', EngineGroupNodeDown),
    (b'{"state": "restarting", "message": "restarting"}', EngineGroupRestarting),
    (b"{}", None),
    (b'{"state": "node_down"}', None),
    (b'{"state": "other", "message": "x"}', None),
    (b'{"state": "node_down", "message": "  "}', None),
    (b'{"state": "node_down", "message": "a\\u0000b"}', None),
    (b"[1]", None),
    (b"", None),
    (b'{"state": "node_down", "message": "' + b"x" * 5000 + b'"}', None),
])  # fmt: skip
def test_the_status_file_is_read_or_ignored(raw_text: bytes, kind: type | None) -> None:
    got = enginestatus.parse(raw_text)
    assert (type(got) if got else None) is kind


def test_a_long_or_multi_line_message_becomes_one_short_line() -> None:
    got = enginestatus.parse(json.dumps({"state": "node_down",
                                         "message": "a\nb  " + "c" * 1000}).encode())
    assert got is not None
    assert "\n" not in got.message
    assert got.message.startswith("a b ccc")
    assert len(got.message) <= enginestatus.MAX_MESSAGE + len(enginestatus.RETRY_HINT)


@given(st.binary(max_size=5000) | st.builds(lambda v: json.dumps(v).encode(), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
        st.sampled_from(["state", "message", "x"]), kids, max_size=3))))
def test_any_file_content_is_a_503_reason_or_none(data: bytes) -> None:
    got = enginestatus.parse(data)
    assert got is None or (isinstance(got, UpstreamUnavailable) and got.status == 503
                           and got.message.isprintable())


def test_an_absent_or_vanishing_file_means_the_generic_503(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    status = enginestatus.EngineStatus(str(path))
    assert status.error() is None
    path.write_text(json.dumps({"state": "node_down", "message": DOWN}))
    first = status.error()
    assert isinstance(first, EngineGroupNodeDown)
    assert status.error() is not first  # a new exception per answer
    path.unlink()
    assert status.error() is None
