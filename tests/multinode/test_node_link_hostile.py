"""Hostile clients on the head's node link (launcher/engine/nodelink.py), over raw sockets on
loopback, while a real node of the group is joined: none of them gets in or speaks for the node,
each is refused with one line at the head, and the group keeps working throughout."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace

import pytest

from launcher.engine import nodelink
from launcher.engine.nodelink import HeadLink, LinkHub, NodeIdentity
from launcher.engine.supervise import free_port
from launcher.errors import EngineError

HEAD = NodeIdentity(nodes=2, node_rank=0, model="toposerve-tiny", tp=1, pp=2, max_model_len=1024)
NODE1 = replace(HEAD, node_rank=1)
SECRET = b"5e" * 32
HELLO_S = 1.0  # the hub's handshake bound here (10 s in the product)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


class Group:
    """A hub with node 1 joined, reporting alive, and what the head's console was told."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self.hub = LinkHub("127.0.0.1", free_port(), HEAD, SECRET, on_refusal=self.said.append,
                           hello_timeout_s=HELLO_S)
        self.hub.start()
        self.hub.set_epoch(1)
        self.node = HeadLink.join("127.0.0.1", self.hub.port, NODE1, SECRET, timeout_s=10)
        self.heard: list[dict[str, object]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._run_node, daemon=True).start()

    def _run_node(self) -> None:
        while not self._stop.is_set():
            self.heard.extend(self.node.messages(0.5))
            if any("lost" in m for m in self.heard):
                return
            self.node.report(alive=True)

    def assert_working(self) -> None:
        """Node 1 still joined, believed alive, and still hearing the head's beats."""
        heard = len(self.heard)
        wait_for(lambda: len(self.heard) > heard)
        assert not any("lost" in m for m in self.heard)
        assert self.hub.connected() == [1]
        assert self.hub.down() is None

    def refusal(self, part: str) -> str:
        wait_for(lambda: any(part in line for line in self.hub.refused))
        (line, *_) = [ln for ln in self.hub.refused if part in ln]
        assert line.startswith("node link: refused a connection from 127.0.0.1: ")
        assert "\n" not in line
        return line

    def close(self) -> None:
        self._stop.set()
        self.node.close()
        self.hub.close()


@pytest.fixture
def group() -> Iterator[Group]:
    g = Group()
    wait_for(lambda: g.hub.connected() == [1])
    yield g
    g.close()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.settimeout(10)
    return sock


def read_line(sock: socket.socket) -> dict[str, object]:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(4096)
        assert chunk, f"closed after {buf!r}"
        buf += chunk
    value = json.loads(buf)
    assert isinstance(value, dict)
    return value


def read_to_eof(sock: socket.socket) -> bytes:
    got = b""
    while chunk := sock.recv(4096):
        got += chunk
    return got


def hello_as(ident: NodeIdentity, challenge: object, secret: bytes | None) -> bytes:
    raw = asdict(ident)
    message: dict[str, object] = {"hello": raw, "nonce": "ab" * 32}
    if secret is not None:
        message["proof"] = nodelink.proof(secret, b"node", bytes.fromhex(str(challenge)),
                                          b"\xab" * 32, nodelink.identity_bytes(raw))
    return nodelink.encode(message)


@pytest.mark.parametrize(("secret", "why"), [
    (None, "node 1 did not prove it holds the group's node secret"),
    (b"00" * 32, "node 1 did not prove it holds the group's node secret"),
])  # fmt: skip
def test_a_client_without_the_secret_cannot_join_or_take_a_nodes_place(
    group: Group, secret: bytes | None, why: str
) -> None:
    with connect(group.hub.port) as sock:
        challenge = read_line(sock)["challenge"]
        sock.sendall(hello_as(NODE1, challenge, secret))
        answer = read_line(sock)
        assert "did not prove it holds the head's node secret" in str(answer["refused"])
        assert read_to_eof(sock) == b""
    group.refusal(why)
    group.assert_working()


def test_a_node_with_a_wrong_secret_is_refused_in_one_line_naming_the_secret(
    group: Group,
) -> None:
    other = replace(NODE1)
    with pytest.raises(EngineError) as err:
        HeadLink.join("127.0.0.1", group.hub.port, other, b"11" * 32, timeout_s=10)
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"the head at 127.0.0.1:{group.hub.port} refused this node: ")
    assert "node secret" in line
    group.assert_working()


def test_a_replayed_proof_from_another_connection_is_refused(group: Group) -> None:
    """A proof seen on the wire (here: made for one challenge) is worth nothing on the next
    connection, whose challenge differs."""
    with connect(group.hub.port) as first:
        old_challenge = read_line(first)["challenge"]
    with connect(group.hub.port) as sock:
        new_challenge = read_line(sock)["challenge"]
        assert new_challenge != old_challenge
        sock.sendall(hello_as(replace(NODE1, node_rank=1), old_challenge, SECRET))
        assert "refused" in read_line(sock)
    group.refusal("did not prove it holds the group's node secret")
    group.assert_working()


@pytest.mark.parametrize(("junk", "why"), [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "not one JSON object per line"),
    (b"\x00" * 10000, f"longer than {nodelink.MAX_LINE} bytes"),
    (b"[" * 5000 + b"\n", f"longer than {nodelink.MAX_LINE} bytes"),
    (b"[" * 3000 + b"\n", "not one JSON object per line"),
    (b'{"hello": 1}\n', "did not say hello as a toposerve node"),
    (b'{"hello": {"nodes": "x"}, "nonce": 5, "proof": []}\n', "did not say hello"),
    (b'{"hello": {"nodes": 2, "node_rank": 1, "model": "toposerve-tiny", "tp": 1, "pp": 2, '
     b'"max_model_len": 1024}, "nonce": "' + b"zz" * 32 + b'", "proof": "x"}\n',
     "did not say hello as a toposerve node"),
])  # fmt: skip
def test_garbage_and_oversized_frames_close_that_connection_only(
    group: Group, junk: bytes, why: str
) -> None:
    with connect(group.hub.port) as sock:
        assert "challenge" in read_line(sock)
        sock.sendall(junk)
        assert read_to_eof(sock) == b""  # nothing but the challenge, then closed
    group.refusal(why)
    group.assert_working()


def test_a_half_open_client_is_closed_after_the_handshake_bound(group: Group) -> None:
    with connect(group.hub.port) as sock:
        assert "challenge" in read_line(sock)
        sock.sendall(b'{"hello": ')  # and then nothing
        started = time.monotonic()
        assert read_to_eof(sock) == b""
        assert time.monotonic() - started < HELLO_S + 8
    group.refusal(f"said nothing of the handshake within {HELLO_S:.0f}s")
    group.assert_working()


def test_a_flood_of_half_open_connections_is_capped_and_a_node_still_joins(
    group: Group,
) -> None:
    socks = [connect(group.hub.port) for _ in range(nodelink.MAX_PENDING_PER_PEER + 6)]
    try:
        group.refusal("too many connections in their handshake")
        # the connections over the cap were closed at once, before any challenge
        closed = 0
        for sock in socks:
            sock.settimeout(HELLO_S + 8)
            got = read_to_eof(sock)
            closed += got == b""
        assert closed >= 6
    finally:
        for sock in socks:
            sock.close()
    group.assert_working()
    group.node.close()  # the same rank joins again once its old link is gone
    wait_for(lambda: group.hub.connected() == [])
    again = HeadLink.join("127.0.0.1", group.hub.port, NODE1, SECRET, timeout_s=10)
    wait_for(lambda: group.hub.connected() == [1])
    again.close()


def test_the_same_refusal_of_the_same_peer_is_said_once_in_a_while(group: Group) -> None:
    for _ in range(5):
        with connect(group.hub.port) as sock:
            read_line(sock)
            sock.sendall(b"junk\n")
            read_to_eof(sock)
    wait_for(lambda: sum("JSON object" in ln for ln in group.hub.refused) == 5)
    assert sum("JSON object" in ln for ln in group.said) == 1


def test_a_message_without_the_links_mac_is_not_believed_and_ends_that_link(
    group: Group,
) -> None:
    """Speaking for a node on its own connection (as an injected segment would) needs the
    connection's key: an unsealed report of a dead share is not taken for the node's word."""
    group.node.link.sock.sendall(nodelink.encode({"epoch": 1, "alive": False, "why": "forged"}))
    wait_for(lambda: group.hub.connected() == [])
    why = group.hub.down()
    assert why is not None
    assert "forged" not in why
    assert "left the node link" in why


def test_a_replayed_sealed_message_ends_that_link(group: Group) -> None:
    sent: list[bytes] = []
    sock = group.node.link.sock
    real_sendall = sock.sendall

    def keep(data: bytes) -> None:  # what went over the wire, to send again
        sent.append(bytes(data))
        real_sendall(data)

    group.node.link.sock = _Recorder(sock, keep)
    wait_for(lambda: bool(sent))
    real_sendall(sent[0])  # the same bytes, again
    wait_for(lambda: group.hub.connected() == [])


class _Recorder:
    """A socket whose sendall is watched."""

    def __init__(self, sock: socket.socket, on_send: Callable[[bytes], None]) -> None:
        self._sock, self._on_send = sock, on_send

    def sendall(self, data: bytes) -> None:
        self._on_send(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


def test_a_fake_head_that_cannot_prove_the_secret_is_not_followed() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def fake_head() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(nodelink.encode({"challenge": "cd" * 32}))
            conn.recv(4096)
            conn.sendall(nodelink.encode({"ok": True, "epoch": 1, "proof": "0" * 64}))
            conn.recv(4096)

    threading.Thread(target=fake_head, daemon=True).start()
    with pytest.raises(EngineError) as err:
        HeadLink.join("127.0.0.1", port, NODE1, SECRET, timeout_s=10)
    server.close()
    (line,) = str(err.value).splitlines()
    assert line == (f"127.0.0.1:{port} did not prove it holds this group's node secret: it is "
                    "not this group's head, or it was given another secret")
