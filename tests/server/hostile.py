"""Helpers for the hostile-client tests: raw HTTP over loopback sockets, what the proxy process
holds (its descriptors, its memory), and a stand-in engine on a raw socket."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def connect(url: str, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(address(url), timeout=timeout)


def request_bytes(method: str, path: str, headers: dict[str, str] | None = None,
                  body: bytes = b"", close: bool = True) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"content-length: {len(body)}")
    if close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool  # the proxy ended the connection after the answer

    def json(self) -> Any:
        return json.loads(self.body)


def read_reply(sock: socket.socket, timeout: float = 10.0, see_close: bool = True) -> Reply:
    """One HTTP/1.1 response (content-length or chunked framing), then (``see_close``)
    whether the connection was ended after it, waiting up to 2 s for the end."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a whole response head: {data[:200]!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if "content-length" in headers:
        need = int(headers["content-length"])
        while len(rest) < need:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        body, extra = rest[:need], rest[need:]
    elif headers.get("transfer-encoding") == "chunked":
        while not rest.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        body, extra = _dechunk(rest), b""
    else:
        body, extra = rest, b""
    closed = False
    if see_close and not extra:
        sock.settimeout(2.0)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
        except OSError:
            closed = True
    return Reply(status, headers, body, closed)


def _dechunk(data: bytes) -> bytes:
    out, pos = b"", 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            return out
        size = int(data[pos:end].split(b";")[0], 16)
        if size == 0:
            return out
        out += data[end + 2:end + 2 + size]
        pos = end + 2 + size + 2


def exchange(url: str, method: str, path: str, headers: dict[str, str] | None = None,
             body: bytes = b"", timeout: float = 10.0) -> Reply:
    with connect(url, timeout) as sock:
        sock.sendall(request_bytes(method, path, headers, body))
        return read_reply(sock, timeout)


def post_json(url: str, path: str, obj: Any, headers: dict[str, str] | None = None,
              timeout: float = 30.0) -> Reply:
    return exchange(url, "POST", path, {"content-type": "application/json", **(headers or {})},
                    json.dumps(obj).encode(), timeout)


def metrics_text(url: str) -> str:
    return exchange(url, "GET", "/metrics").body.decode()


# -- what the proxy process holds ---------------------------------------------------------------

def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for name in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def holds_connection(pid: int, client: socket.socket) -> bool:
    """Whether process ``pid`` has a descriptor open on the other end of ``client``."""
    port = client.getsockname()[1]
    mine = f"{port:04X}"
    inodes = _socket_inodes(pid)
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            remote_port = fields[2].split(":")[1]
            if remote_port == mine and fields[9] in inodes:
                return True
    return False


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# -- a stand-in engine on a raw socket ---------------------------------------------------------

@dataclass
class StandIn:
    """Answers GET /health and GET /v1/models (after ``models_delay``, keep-alive), and closes
    the connection without answering whatever else comes — counting each request it saw."""

    url: str = ""
    models_delay: float = 0.0
    close_models: bool = False  # GET /v1/models too is closed without an answer
    # a POST is answered with these SSE events, one chunk each (else closed unanswered)
    stream: list[bytes] | None = None
    require_key: str | None = None  # anything without "authorization: Bearer <it>" gets 401
    authorizations: list[str] = field(default_factory=list)  # each request's, "" for none
    heads: list[str] = field(default_factory=list)  # each request's head, as sent
    seen: list[str] = field(default_factory=list)
    connections: int = 0  # accepted so far
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, what: str) -> int:
        with self.lock:
            return sum(1 for s in self.seen if s == what)


@contextmanager
def stand_in_engine(**settings: Any) -> Iterator[StandIn]:
    engine = StandIn(**settings)
    server = socket.create_server(("127.0.0.1", 0))
    engine.url = f"http://127.0.0.1:{server.getsockname()[1]}"
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            data = b""
            while not stop.is_set():
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                auth = ""
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                    if name.strip().lower() == "authorization":
                        auth = value.strip()
                while len(data) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                data = data[length:]
                with engine.lock:
                    engine.seen.append(f"{method} {path}")
                    engine.authorizations.append(auth)
                    engine.heads.append(head.decode("latin-1"))
                if engine.require_key and auth != f"Bearer {engine.require_key}":
                    body = b'{"error": "Unauthorized"}'
                    conn.sendall(b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json"
                                 b"\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))
                    continue
                if method == "GET" and path == "/health":
                    body = b""
                elif method == "GET" and path == "/v1/models" and not engine.close_models:
                    time.sleep(engine.models_delay)
                    body = b'{"object": "list", "data": [{"id": "stand-in"}]}'
                elif method == "POST" and engine.stream is not None:
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                 b"transfer-encoding: chunked\r\n\r\n")
                    for event in engine.stream:
                        conn.sendall(b"%x\r\n%b\r\n" % (len(event), event))
                    conn.sendall(b"0\r\n\r\n")
                    continue
                else:
                    return  # closed without answering
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%b" % (len(body), body))

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with engine.lock:
                engine.connections += 1
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        stop.set()
        with contextlib.suppress(OSError):  # wakes the accept loop, which close() alone does not
            server.shutdown(socket.SHUT_RDWR)
        server.close()


# -- a scripted engine: any bytes on the wire for the generation requests ----------------------

Script = Callable[[socket.socket, str, str, bytes], None]


@contextmanager
def scripted_engine(script: Script) -> Iterator[str]:
    """An engine on a raw loopback socket that answers GET /health and GET /v1/models as vLLM
    does (so the proxy takes it as up), and hands every other request to ``script(conn,
    method, path, body)``, which writes whatever bytes it likes (and returns to keep the
    connection, or closes it). Yields its URL."""
    server = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            data = b""
            while not stop.is_set():
                while b"\r\n\r\n" not in data:
                    try:
                        chunk = conn.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                while len(data) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                body, data = data[:length], data[length:]
                if method == "GET" and path in ("/health", "/v1/models"):
                    answer = (b"" if path == "/health" else
                              b'{"object": "list", "data": [{"id": "scripted"}]}')
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\n\r\n%b" % (len(answer), answer))
                    continue
                try:
                    script(conn, method, path, body)
                except OSError:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield url
    finally:
        stop.set()
        with contextlib.suppress(OSError):  # wakes the accept loop, which close() alone does not
            server.shutdown(socket.SHUT_RDWR)
        server.close()


def sse_chunks(events: list[bytes]) -> bytes:
    """A chunked text/event-stream response carrying ``events`` (one chunk each)."""
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
            + b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n")


def json_answer(body: bytes, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 %b\r\ncontent-type: application/json\r\n%bcontent-length: %d\r\n\r\n%b"
            % (status, extra, len(body), body))


def assert_route_error(answer: Any, anthropic: bool, code: str, kind: str = "invalid_request_error"
                       ) -> None:
    """An error answer in the route's format: Anthropic's (``type`` error, its error ``kind``)
    on the Anthropic routes, else OpenAI's with ``code``."""
    if anthropic:
        assert answer["type"] == "error", answer
        assert answer["error"]["type"] == kind, answer
    else:
        assert answer["error"]["code"] == code, answer
