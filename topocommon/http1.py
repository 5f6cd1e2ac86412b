"""The one HTTP/1.1 client connection of the proxy (server.upstream), loadgen (loadgen.transport)
and the benchmark client (simengine.client): an asyncio protocol that reads responses with
httptools (llhttp, the parser uvicorn uses) and hands each one's parts to a ``Reader``, in the
read callback: no stream reader, no task or future per body chunk.

What mature clients do with a response head, done here for all three (issue 25): the head
(status line and headers, interim 1xx heads included) is bounded at ``MAX_HEAD_BYTES`` as it
arrives, so a server sending header lines forever, or one endless line, costs at most that much
memory and parser time and is a ``BadResponse`` at once; interim responses (100 Continue, 103
Early Hints) are skipped and the final one read; a 101, a status outside 100-599 or an
unparsable head is a ``BadResponse``; trailers after a chunked body are dropped (never headers
of the answer); a body delimited by the connection's close (no Content-Length, not chunked,
e.g. an HTTP/1.0 answer) is complete at that close; the answer to HEAD ends with its head.

Where the three differ, they differ outside this module: the proxy's pool never sends a POST
twice and relays a body chunk from ``on_body`` straight to its client (server.upstream);
loadgen and the benchmark client stamp every read with ``perf_counter()`` before it is parsed,
the first Python code that runs when the socket is readable (``TimedConnection``), which the
proxy has no use for and does not pay for per token; loadgen sends a request again on a fresh
connection when a reused one closed before any byte of the answer (a benchmark's request, not a
client's), and the benchmark client opens one connection per request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

import httptools

# A response head, interim ones included. vLLM's are a few hundred bytes; nginx's default limit
# (proxy_buffer_size) is 4-8 KiB. Checked per read: the parser sees at most one read (256 KiB
# under uvloop) past it.
MAX_HEAD_BYTES = 64 * 1024

Headers = list[tuple[bytes, bytes]]  # names lower-cased, in the order received


class BadResponse(Exception):
    """The answer is not HTTP/1.1 a client can read (a head over MAX_HEAD_BYTES, a 101, a
    status outside 100-599, bytes the parser refuses before the head ended)."""


class _Unasked(Exception):
    """Raised inside the parser: a response began while none was awaited."""


class Reader(Protocol):
    """What a connection hands the parts of one response to, as they are parsed."""

    def on_head(self, status: int, headers: Headers, keep_alive: bool) -> None: ...

    def on_body(self, body: bytes) -> None: ...

    def on_complete(self) -> None: ...

    def on_lost(self, error: BadResponse | None) -> None:
        """The connection ended, or was found unusable, before the response completed (never
        called after ``on_complete``); ``error`` says why when the answer was not HTTP."""


class _NoReader:
    """Between responses: bytes an idle connection receives go nowhere (none are expected; the
    connection is not reused if its parser found them wrong)."""

    def on_head(self, status: int, headers: Headers, keep_alive: bool) -> None:
        pass

    def on_body(self, body: bytes) -> None:
        pass

    def on_complete(self) -> None:
        pass

    def on_lost(self, error: BadResponse | None) -> None:
        pass


_NO_READER = _NoReader()


def close_delimited(status: int, headers: Headers) -> bool:
    """The body ends when the connection closes (RFC 9112 6.3): no Content-Length, and no
    chunked coding (an HTTP/1.0 answer, typically)."""
    if status in (204, 304) or 100 <= status < 200:
        return False
    for name, value in headers:
        if name == b"content-length" or (
                name == b"transfer-encoding" and value.lower().rstrip().endswith(b"chunked")):
            return False
    return True


def request_bytes(method: str, target: str, authority: str, headers: Iterable[tuple[str, str]],
                  body: bytes) -> bytes:
    """One whole HTTP/1.1 request: a Content-Length whenever there is a body or the method
    carries one (a POST with an empty body says so)."""
    head = [f"{method} {target} HTTP/1.1\r\nhost: {authority}\r\n"]
    head += [f"{k}: {v}\r\n" for k, v in headers]
    if body or method in ("POST", "PUT", "PATCH"):
        head.append(f"content-length: {len(body)}\r\n")
    return "".join(head).encode("latin-1") + b"\r\n" + body


class ClientConnection(asyncio.Protocol):
    """One keep-alive connection, one response at a time: ``start(reader)``, write the request
    to ``transport``, and the reader gets the answer's head, body chunks and end."""

    PEER = "the server"  # who answers, in BadResponse messages ("the engine" in the proxy)

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0  # when it was last put back idle; 0.0: never used before
        self.reader: Reader = _NO_READER
        self.reading = False  # a response is being read (start() was called, not yet ended)
        self.in_head = False  # reading a response head (interim ones included)
        self.head_bytes = 0
        self.headers: Headers = []
        self.status = 0  # of the final response, once its head is complete
        self.interim = False  # the message being parsed is a 1xx: its end is not the answer's
        self.no_body = False  # the request was HEAD: the answer ends with its head
        # Made inside the running loop (create_connection's factory); kept so that waiting for
        # a response does not look the loop up each time (a getpid() system call in 3.11).
        self.loop = asyncio.get_running_loop()

    # -- driving ----------------------------------------------------------------------------

    def start(self, reader: Reader, method: str = "GET") -> None:
        self.reader = reader
        self.reading = True
        self.in_head, self.head_bytes, self.interim = True, 0, False
        self.headers, self.status = [], 0
        self.no_body = method == "HEAD"

    def detach(self) -> None:
        """The reader is done with this connection (whether or not the answer ended)."""
        self.reader = _NO_READER
        self.reading = False

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport.
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.reading:
            return
        if self.status and not self.in_head and close_delimited(self.status, self.headers):
            self._end()  # its body ends where the connection does
        else:
            self._lose(None)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._bad(f"{self.PEER} switched protocols (101) on a request that asked for none")
            return
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _Unasked):  # httptools wraps what a callback raised
                self._bad(f"{self.PEER} sent a response nobody asked for")
            elif self.in_head:
                self._bad(f"{self.PEER}'s response head is not valid HTTP/1.1 ({exc})")
            else:  # a broken body: the answer cannot end, nor the connection be reused
                self._bad(f"{self.PEER}'s response body is not valid HTTP/1.1 ({exc})")
            return
        if self.in_head and self.reading:
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                self._bad(f"{self.PEER}'s response head is over {MAX_HEAD_BYTES} bytes")

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        # A response begins while none is awaited: after the answer ended (in the same read or
        # later, while the connection idles). The connection is out of step with its requests:
        # what follows would be read as the answer to the next request sent on it, or reach
        # the reader after its answer ended. Closed, as h11 and urllib3 do; nothing of it is
        # handed on.
        if not self.reading:
            raise _Unasked

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.in_head:  # not trailers: they are dropped
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if not self.reading:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # interim (101 raised HttpParserUpgrade): the final one follows
            self.interim = True
            self.headers = []
            return
        if not 200 <= status <= 599:
            self._bad(f"{self.PEER} answered with status {status:03d}, not an HTTP status")
            return
        self.in_head = False
        self.status = status
        if self.no_body:
            # An answer to HEAD has no body whatever its Content-Length says (RFC 9110 9.3.2),
            # and httptools cannot be told so: it would wait for that many bytes until a
            # timeout. Complete now; the connection is not reused, since its parser still
            # expects them.
            self.reader.on_head(status, self.headers, False)
            self._end()
            return
        self.reader.on_head(status, self.headers, self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        if self.reading:  # not the body of an answer to HEAD, which ended with its head
            self.reader.on_body(body)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if self.reading:
            self._end()

    # -- ends ---------------------------------------------------------------------------------

    def _end(self) -> None:
        reader = self.reader
        self.reading = False
        reader.on_complete()

    def _lose(self, error: BadResponse | None) -> None:
        reader = self.reader
        self.reading = False
        reader.on_lost(error)

    def _bad(self, message: str) -> None:
        if self.reading:
            self._lose(BadResponse(message))
        self.abort()


class TimedConnection(ClientConnection):
    """A connection that stamps each read with ``perf_counter()`` (``t``) before parsing it:
    the arrival time of every part the reader gets (loadgen, the benchmark client)."""

    def __init__(self) -> None:
        super().__init__()
        self.t = 0.0

    def data_received(self, data: bytes) -> None:
        self.t = time.perf_counter()
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.t = time.perf_counter()
        super().connection_lost(exc)


C = TypeVar("C", bound=ClientConnection)


class IdleConnections(Generic[C]):
    """Keep-alive connections waiting for their next request, youngest reused first; one idle
    longer than ``max_idle_s`` is closed instead (servers close idle ones after a few seconds:
    uvicorn, vLLM's, after 5; a request written as that close crosses it is lost)."""

    def __init__(self, max_idle_s: float) -> None:
        self.max_idle_s = max_idle_s
        self.idle: list[C] = []

    def put(self, conn: C) -> None:
        conn.idle_since = time.monotonic()
        self.idle.append(conn)

    def take(self) -> C | None:
        """The most recently put connection still open and young enough; the others are
        closed (a closed one was never written to: nothing was sent on it)."""
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            transport = conn.transport
            if (conn.closed or transport is None or transport.is_closing()
                    or now - conn.idle_since > self.max_idle_s):
                conn.abort()
                continue
            return conn
        return None

    def close(self) -> None:
        for conn in self.idle:
            conn.abort()
        self.idle.clear()
