"""The node link between the head's and the other nodes' launchers (launcher/engine/nodelink.py),
over real sockets on loopback: agreement on the plan, a lost node or head, an unreachable head,
and whatever else reaches the head's port."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.engine import nodelink
from launcher.engine.nodelink import HeadLink, LinkHub, NodeIdentity, NodeState, node_down
from launcher.engine.supervise import free_port
from launcher.errors import EngineError

HEAD = NodeIdentity(nodes=2, node_rank=0, model="toposerve-tiny", tp=1, pp=2, max_model_len=1024)
NODE1 = replace(HEAD, node_rank=1)
SECRET = b"a8" * 32


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@pytest.fixture
def hub() -> Iterator[LinkHub]:
    h = LinkHub("127.0.0.1", free_port(), HEAD, SECRET, hello_timeout_s=2.0)
    h.start()
    h.set_epoch(1)
    yield h
    h.close()


def test_a_node_that_plans_the_same_joins_and_gets_the_heads_epoch(hub: LinkHub) -> None:
    link = HeadLink.join("127.0.0.1", hub.port, NODE1, SECRET, timeout_s=10)
    assert link.epoch == 1
    wait_for(lambda: hub.connected() == [1])
    assert hub.missing() == []
    link.close()


@pytest.mark.parametrize(("change", "named"), [
    ({"model": "other-model"}, "model other-model here against toposerve-tiny on the head"),
    ({"tp": 2, "pp": 1}, "tp 2 here against 1 on the head, pp 1 here against 2 on the head"),
    ({"nodes": 3}, "nodes 3 here against 2 on the head"),
])  # fmt: skip
def test_a_node_whose_plan_differs_is_refused_in_one_line(
    hub: LinkHub, change: dict[str, object], named: str
) -> None:
    with pytest.raises(EngineError) as err:
        HeadLink.join("127.0.0.1", hub.port, replace(NODE1, **change), SECRET, timeout_s=10)
    (line,) = str(err.value).splitlines()
    assert named in line
    assert line.endswith("or pass the head's saved plan with --plan")
    assert hub.connected() == []


def test_a_second_node_with_the_same_rank_is_refused(hub: LinkHub) -> None:
    first = HeadLink.join("127.0.0.1", hub.port, NODE1, SECRET, timeout_s=10)
    with pytest.raises(EngineError, match=r"node 1 is already connected from 127\.0\.0\.1"):
        HeadLink.join("127.0.0.1", hub.port, NODE1, SECRET, timeout_s=10)
    first.close()


def test_a_node_whose_share_exits_is_named_with_why(hub: LinkHub) -> None:
    link = HeadLink.join("127.0.0.1", hub.port, NODE1, SECRET, timeout_s=10)
    link.report(alive=True)
    time.sleep(0.2)
    assert hub.down() is None
    link.report(alive=False, why="its VLLM::Worker_PP1 (pid 42) is gone")
    wait_for(lambda: hub.down() is not None)
    assert hub.down() == "node 1 (127.0.0.1): its vLLM share exited (its VLLM::Worker_PP1 " \
        "(pid 42) is gone)"
    link.close()


def test_a_node_whose_launcher_goes_away_is_named(hub: LinkHub) -> None:
    link = HeadLink.join("127.0.0.1", hub.port, NODE1, SECRET, timeout_s=10)
    wait_for(lambda: hub.connected() == [1])
    link.close()
    wait_for(lambda: hub.down() is not None)
    assert str(hub.down()).startswith("node 1 (127.0.0.1) left the node link")
    assert hub.missing() == [1]


def test_the_head_stopping_tells_the_node_to_stop(hub: LinkHub) -> None:
    link = HeadLink.join("127.0.0.1", hub.port, NODE1, SECRET, timeout_s=10)
    wait_for(lambda: hub.connected() == [1])

    def close_when_told() -> None:
        for msg in link.messages(5.0):
            if "stop" in msg:
                link.close()
                return

    threading.Thread(target=close_when_told, daemon=True).start()
    assert hub.stop_nodes("the head is stopping", wait_s=10.0) == []


def test_a_head_that_goes_away_is_noticed_by_the_node() -> None:
    h = LinkHub("127.0.0.1", free_port(), HEAD, SECRET)
    h.start()
    h.set_epoch(1)
    link = HeadLink.join("127.0.0.1", h.port, NODE1, SECRET, timeout_s=10)
    h.close()
    lost = [m for m in link.messages(10.0) if "lost" in m]
    assert lost == [{"lost": f"the head at 127.0.0.1:{h.port} closed the node link"}]


def test_a_closed_hub_stops_listening_and_its_port_can_be_bound_again() -> None:
    import socket

    h = LinkHub("127.0.0.1", free_port(), HEAD, SECRET)
    h.start()
    socket.create_connection(("127.0.0.1", h.port), timeout=5).close()  # its accept loop is up
    h.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", h.port), timeout=5)
    again = LinkHub("127.0.0.1", h.port, HEAD, SECRET)
    again.start()  # a restarted head listens on the same master port + 1
    again.close()


def test_an_unreachable_head_is_one_line_naming_address_port_and_what_to_check() -> None:
    port = free_port()  # nothing listens there
    waits: list[float] = []
    started = time.monotonic()
    with pytest.raises(EngineError) as err:
        HeadLink.join("127.0.0.1", port, NODE1, SECRET, timeout_s=2.0, on_wait=waits.append)
    assert time.monotonic() - started < 10
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"cannot reach the head at 127.0.0.1:{port} (toposerve's node link")
    assert "--node-rank 0" in line
    assert "firewall" in line
    assert waits  # it said it was waiting before giving up


def test_silence_longer_than_the_timeout_is_a_lost_node() -> None:
    node = NodeState(rank=1, peer="10.0.0.2", last_seen=100.0, epoch=1, alive=True)
    assert node_down(node, 1, 100.0 + nodelink.TIMEOUT_S - 0.1) is None
    why = node_down(node, 1, 100.0 + nodelink.TIMEOUT_S + 1)
    assert why is not None
    assert why.startswith("node 1 (10.0.0.2) has said nothing for 6s")


def test_a_share_not_yet_restarted_for_the_new_epoch_is_not_a_failure() -> None:
    node = NodeState(rank=1, peer="h", last_seen=0.0, epoch=1, alive=False, why="gone")
    assert node_down(node, 2, 0.0) is None  # the head already restarts the group


@given(st.binary(max_size=6000))
def test_any_bytes_decode_to_a_message_object_or_none(raw: bytes) -> None:
    msg = nodelink.decode(raw)
    assert msg is None or isinstance(msg, dict)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(st.text(max_size=10), kids, max_size=4)))
def test_any_json_as_an_identity_is_read_or_refused(value: object) -> None:
    ident = NodeIdentity.from_json(value)
    assert ident is None or isinstance(ident, NodeIdentity)
    assert NodeIdentity.from_json(json.loads(json.dumps({"hello": value}))["hello"]) == ident
