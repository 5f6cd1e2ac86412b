"""The proxy's HTTP/1.1 front: the two generation routes served without uvicorn's cycle.

uvicorn (with httptools) is the server: it owns the sockets, the lifespan, signals and the
graceful drain, and every request but one kind goes through its protocol to the FastAPI app.
That one kind is the hot path: ``POST /v1/chat/completions`` and ``POST /v1/completions`` over
HTTP/1.1 with a Content-Length body. For those, this protocol parses the request itself and
hands ``Proxy.generation`` a small ``Exchange`` as its ASGI ``receive``/``send``, skipping what
uvicorn sets up per connection and per request for the general case (socket address look-ups,
flow-control and event objects, scope and state copies, header validation of the app's
answer, message dispatch). Measured with benchmarks/proxy_cpu.py (docs/benchmarks-proxy.md).

Why it is kept rather than plain uvicorn for every request (issue 25's rule: a hand-written
path only for a speed-up beyond the noise that passes every attack): its proxy CPU per request,
270 against 293 µs (session 3) and 930 against 1,008 µs with 512-id prompts on a loaded machine
(issue 25), the steadier measure; side by side on a loaded machine its added TTFT
against uvicorn's protocol was within the noise (+0.61 against +0.96 ms at one stream, IQRs
overlapping). It passes the issue's attacks (tests/server/test_http_layers.py).

Anything else — another route or method, HTTP/1.0, ``Expect: 100-continue``, a chunked request
body, a request httptools rejects — is handed over whole: the connection (with every byte of
that request, and whatever followed it) goes to uvicorn's protocol for the rest of its life,
exactly as if uvicorn had had it from the start. Requests are served one at a time per
connection; bytes that arrive while one is being answered (pipelining) wait, unparsed.

Two things are refused here, and by uvicorn's guarded protocol (server.uvicorn_adapter) alike,
before any app sees them (``refuse``: an OpenAI-format error, then the connection is closed): an
upgrade (``Connection: upgrade``, ``Upgrade:``, ``CONNECT``; the proxy serves no websockets, and
an upgraded connection escapes every timeout), and a request head over the limits of
``HeadLimit`` (431), counted as it arrives so that an endless header line is cut off before
httptools, which concatenates a header's pieces, spends time and memory on it. A client whose
socket accepts nothing for ``Guards.stall_timeout_s`` is disconnected (``StallTimer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote

import httptools

from server import anthropic
from server.asgi import (
    DISCONNECT_HOOK,
    AsgiDownstream,
    Message,
    Receive,
    Scope,
    Send,
    client_left,
    new_disconnect_hook,
)
from server.errors import SHUTDOWN_MESSAGE, error_body

log = logging.getLogger("toposerve")
GENERATION_PATHS = frozenset({b"/v1/chat/completions", b"/v1/completions"})
# A streamed response's head is held this long for the stream's first chunk (Exchange._start):
# past it the head goes out alone, so a client sees the 200 within this of the engine's head
# even while the engine is still reading a long prompt.
HEAD_HOLD_S = 1.0
HIGH_WATER = 64 * 1024  # unread request bytes at which reading pauses (as uvicorn does)
_STATUS_LINES = {int(s): b"HTTP/1.1 %d %s\r\n" % (s, s.phrase.encode()) for s in http.HTTPStatus}
_HEAD_END = b"\r\n\r\n"  # httptools (llhttp, strict) ends a head only at the first CRLFCRLF
_NO_BODY = frozenset({204, 304})
LINGER_S = 1.0  # after a refusal: read and drop what the client still sends, then close,
LINGER_BYTES = 64 * 1024  # or sooner, once it sent this much more (it is not listening)


@dataclass(frozen=True)
class Guards:
    """What both protocols (this one and server.uvicorn_adapter's) enforce on every connection."""

    header_timeout_s: float = 15.0
    max_header_line_bytes: int = 16 * 1024
    max_header_bytes: int = 64 * 1024
    stall_timeout_s: float = 30.0
    on_stall: Callable[[], None] | None = None  # counts a client cut off for not reading
    # Counts and logs a request refused here (its status, and its route as request_target
    # reads it), as the app counts and logs what its routes answer.
    on_refused: Callable[[int, str], None] | None = None


class HeadLimit:
    """Bounds one request head (request line, header lines) as its bytes arrive.

    Fed every chunk until the blank line that ends the head; ``feed`` returns the limit it
    went over, else None. A head that comes whole in its first chunk and is shorter than one
    line's limit (every usual request) costs one ``find``."""

    __slots__ = ("cr", "done", "end", "fast_max", "head_max", "line", "line_max", "lines",
                 "total")

    def __init__(self, line_max: int, head_max: int) -> None:
        self.line_max = line_max
        self.head_max = head_max
        self.fast_max = min(line_max, head_max)  # a whole head this short is within both
        self.reset()

    def reset(self) -> None:
        self.done = False
        # Where the head ended in the chunk whose feed ended it (just past its blank line),
        # else -1: the bytes after it in that chunk are the request's body and what follows.
        self.end = -1
        self.line = 0  # bytes of the line being received
        self.total = 0
        self.lines = 0  # non-blank lines so far (blank ones before the request line are skipped)
        self.cr = False  # the last byte seen was CR

    def feed(self, data: bytes) -> str | None:
        if self.done:
            return None
        if not self.total and data[:1] not in b"\r\n":
            end = data.find(_HEAD_END, 0, self.fast_max)
            if end >= 0:
                self.done, self.end = True, end + len(_HEAD_END)
                return None
        pos, end = 0, len(data)
        while True:
            nl = data.find(b"\n", pos)
            if nl < 0:
                self.line += end - pos
                self.total += end - pos
                if end > pos:
                    self.cr = data[end - 1] == 13
                return self._over()
            length = self.line + nl - pos  # the line's bytes before its LF
            self.total += nl + 1 - pos
            blank = length == 0 or (length == 1 and (data[nl - 1] == 13 if nl > pos
                                                     else self.cr))
            self.line, self.cr, pos = 0, False, nl + 1
            if length > self.line_max:
                return f"a request header line is over {self.line_max} bytes"
            if self.total > self.head_max:
                return self._over()
            if not blank:
                self.lines += 1
            elif self.lines:
                self.done, self.end = True, pos
                return None

    def _over(self) -> str | None:
        if self.line > self.line_max:
            return f"a request header line is over {self.line_max} bytes"
        if self.total > self.head_max:
            return f"the request headers are over {self.head_max} bytes in all"
        return None


def request_target(url: bytes, head: bytes = b"") -> str:
    """The route the request names, as far as it is known, for the format of its refusal: the
    parser's ``url``, else the second word of ``head``'s first line (a head refused before the
    parser read it); an absolute-form target's path (RFC 9112 3.2.2), percent-decoded, with
    its query: the route as the app matches it (uvicorn decodes the path it routes)."""
    if not url:
        words = head[:head.find(b"\n")].split(b" ", 2) if b"\n" in head else head.split(b" ", 2)
        url = words[1] if len(words) > 1 else b""
    url = url[:4096]
    if url[:1] not in (b"/", b"*", b""):  # scheme://authority/path?query
        rest = url.partition(b"://")[2]
        start = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
        url = rest[start:] if rest[start:start + 1] == b"/" else b"/" + rest[start:]
    return unquote(url.decode("latin-1"), encoding="latin-1")


def refusal(default_headers: Any, status: int, message: str, code: str,
            target: str = "") -> bytes:
    """A whole HTTP response: the error in the format of the route ``target`` names (the
    Anthropic one on /v1/messages, else OpenAI's), and the connection closing after it."""
    if anthropic.is_anthropic(target):
        body = json.dumps(anthropic.error_body(status, message)).encode()
    else:
        body = json.dumps(error_body(message, "invalid_request_error", code, None)).encode()
    parts = [_STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status]
    for name, value in default_headers:
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"content-type: application/json\r\ncontent-length: %d\r\n"
                 b"connection: close\r\n\r\n%b" % (len(body), body))
    return b"".join(parts)


class Refusal:
    """A connection answered with an error and ending: the answer, then our side's FIN. What
    the client still sends is read and dropped (``drop``, from data_received) for at most
    LINGER_S and LINGER_BYTES, so that closing with unread bytes does not reset the answer
    away before the client reads it; then the connection is aborted."""

    __slots__ = ("budget", "timer", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 default_headers: Any, status: int, message: str, code: str,
                 target: str = "") -> None:
        log.info("refused a request: %d %s", status, message)
        self.transport = transport
        self.budget = LINGER_BYTES
        transport.write(refusal(default_headers, status, message, code, target))
        try:
            transport.write_eof()
        except (NotImplementedError, RuntimeError, OSError):  # pragma: no cover - TLS
            transport.close()
        transport.resume_reading()
        self.timer = loop.call_later(LINGER_S, transport.abort)

    def drop(self, data: bytes) -> None:
        self.budget -= len(data)
        if self.budget < 0:
            self.transport.abort()

    def cancel(self) -> None:
        self.timer.cancel()


refuse = Refusal


INVALID_HTTP = ("the request is not valid HTTP/1.1 ({why}); send plain HTTP/1.1 requests (no "
                "HTTP/2, one Content-Length or chunked body, no folded header lines or control "
                "characters in headers)")
UPGRADE_REFUSED = ("this server does not switch protocols (Upgrade, websocket, CONNECT): send "
                   "plain HTTP/1.1 requests without an Upgrade header")
HOST_REQUIRED = ("an HTTP/1.1 request must carry a Host header (RFC 9112 3.2): send 'Host: "
                 "127.0.0.1:PORT', the address and port you connect to")


TRANSFER_CODING = ("the request body is sent in a transfer coding this proxy does not decode "
                   "(Transfer-Encoding: {coding}): send the body plainly, with a "
                   "Content-Length or 'Transfer-Encoding: chunked' alone")


def foreign_coding(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The Transfer-Encoding value when it names a coding besides ``chunked`` (names
    lower-case), else None. llhttp takes ``gzip, chunked`` (chunked last) and de-chunks it,
    leaving the body still in the other coding."""
    for name, value in headers:
        if name == b"transfer-encoding" and any(
                token.strip().lower() != b"chunked" for token in value.split(b",")):
            return value.decode("latin-1").strip()
    return None


def lacks_host(version: str, headers: list[tuple[bytes, bytes]]) -> bool:
    """An HTTP/1.1 request without Host (names lower-case), which RFC 9112 3.2 says a server
    MUST answer 400; HTTP/1.0 has no such rule (its tools may leave Host out)."""
    return version != "1.0" and all(name != b"host" for name, _ in headers)


def wants_upgrade(headers: list[tuple[bytes, bytes]]) -> bool:
    """``Upgrade:`` present, or ``upgrade`` among the Connection tokens (names lower-case)."""
    for name, value in headers:
        if name == b"upgrade" or (name == b"connection" and b"upgrade" in value.lower()):
            return True
    return False


def head_too_large(limit: HeadLimit, what: str) -> str:
    return (f"{what}; the limits are {limit.line_max} bytes a line and {limit.head_max} in all "
            "(--max-header-line-bytes, --max-header-bytes)")


class StallTimer:
    """Cuts off a client whose socket accepts nothing for ``timeout_s``: armed when the
    transport pauses writing, disarmed when it resumes. Aborting drops what is buffered for
    it (closing would wait for that to drain, which it never does), and the protocol's
    connection_lost then tells the relay the client left, which aborts the engine request.

    Honest about progress: a client reading steadily through one large write keeps the
    transport paused until most of it drained, so at expiry the timer looks at the write
    buffer, and a buffer that shrank since the timer was set is a client still reading: the
    timer is set again (as nginx's send_timeout, between two successful writes)."""

    __slots__ = ("buffered", "guards", "loop", "timer", "transport")

    def __init__(self, loop: asyncio.AbstractEventLoop, guards: Guards) -> None:
        self.loop = loop
        self.guards = guards
        self.timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.buffered = 0

    def paused(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.timer is None:
            self.buffered = _write_buffered(transport)
            self.timer = self.loop.call_later(self.guards.stall_timeout_s, self._expire)

    def resumed(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        self.timer = None
        transport = self.transport
        if transport is None:
            return
        buffered = _write_buffered(transport)
        if buffered < self.buffered:  # it took some: still reading
            self.buffered = buffered
            self.timer = self.loop.call_later(self.guards.stall_timeout_s, self._expire)
            return
        log.info("a client took nothing for %g s: disconnected", self.guards.stall_timeout_s)
        if self.guards.on_stall is not None:
            self.guards.on_stall()
        transport.abort()  # type: ignore[attr-defined]


def _write_buffered(transport: asyncio.BaseTransport) -> int:
    try:
        return int(transport.get_write_buffer_size())  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # pragma: no cover - a transport that cannot say
        return 0


class Exchange:
    """One lean request: its body as it arrives, and its response as the relay sends it.

    ``receive`` and ``send`` follow the ASGI messages the relay uses; ``ready``/``write`` let
    the relay's read callback write a token event straight to the socket (server.relay)."""

    __slots__ = ("body", "chunked", "disconnected", "head", "head_timer", "keep_alive",
                 "more_body", "proto", "remaining", "response_complete", "response_started",
                 "taken", "transport", "waiter")

    def __init__(self, proto: FrontProtocol, keep_alive: bool) -> None:
        self.proto = proto
        self.transport = proto.transport
        self.keep_alive = keep_alive
        self.body = bytearray()
        self.more_body = True  # until the request's last byte arrived
        self.taken = False  # receive() handed out the end of the body
        self.waiter: asyncio.Future[None] | None = None
        self.response_started = False
        self.response_complete = False
        self.chunked = False
        self.remaining = 0
        self.disconnected = False
        # A chunked (streamed) response's head, held for its first chunk (flush_head)
        self.head: bytes | None = None
        self.head_timer: asyncio.TimerHandle | None = None

    # -- fed by the protocol ---------------------------------------------------------------

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- ASGI receive ----------------------------------------------------------------------

    def body_buffered(self) -> bool:
        """The whole body is here: the next receive() will not wait."""
        return not self.more_body and not self.disconnected

    async def receive(self) -> Message:
        while not self.disconnected:
            if not self.taken and (self.body or not self.more_body):
                body, more = bytes(self.body), self.more_body
                self.body.clear()
                self.taken = not more
                self.proto.resume_reading()
                return {"type": "http.request", "body": body, "more_body": more}
            if self.taken and self.response_complete:
                break  # after the answer, as uvicorn does: the request is over
            self.waiter = self.proto.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        return {"type": "http.disconnect"}

    # -- ASGI send, and the relay's direct writes --------------------------------------------

    def ready(self) -> bool:
        return not (self.disconnected or self.response_complete or self.proto.write_paused)

    def write(self, data: bytes) -> None:
        """One body chunk of a started chunked response, written at once."""
        head = self.head
        if head is not None:
            self._held_out()
            self.transport.write(b"%b%x\r\n%b\r\n" % (head, len(data), data))
            return
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    def flush_head(self) -> None:
        """The held head goes out alone: no chunk came within HEAD_HOLD_S, or the response
        ends without one."""
        head = self.head
        if head is not None:
            self._held_out()
            if not self.disconnected:
                self.transport.write(head)

    def _held_out(self) -> None:
        self.head = None
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def abort(self) -> None:
        """The response cannot be completed: the connection is cut."""
        self._held_out()
        self.keep_alive = False
        self.transport.abort()

    async def send(self, message: Message) -> None:
        if self.proto.write_paused and not self.disconnected:
            await self.proto.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {kind}")
            self._start(message["status"], message.get("headers", ()))
            return
        if self.response_complete or kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind} after the response")
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        if self.chunked:
            data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more:
                data += b"0\r\n\r\n"
            if self.head is not None and (data or not more):
                data = self.head + data
                self._held_out()
        else:
            if len(body) > self.remaining:
                raise RuntimeError("response longer than its content-length")
            self.remaining -= len(body)
            data = body
        if data:
            self.transport.write(data)
        if not more:
            if self.remaining:
                raise RuntimeError("response shorter than its content-length")
            self.response_complete = True
            self.wake()
            self.proto.response_done(self)

    def _start(self, status: int, headers: Any) -> None:
        self.response_started = True
        parts = [_STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status]
        for name, value in self.proto.host.default_headers:  # date, as uvicorn sends
            parts += (name, b": ", value, b"\r\n")
        length: int | None = None
        for name, value in headers:
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name:
                raise RuntimeError("invalid HTTP header")
            name = name.lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and b"close" in value.lower():
                self.keep_alive = False
            elif name == b"transfer-encoding":
                continue  # framing is this side's to choose
            parts += (name, b": ", value, b"\r\n")
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        if length is not None:
            self.remaining = length
        elif status in _NO_BODY or status < 200:
            self.remaining = 0
        else:
            self.chunked = True
            parts.append(b"transfer-encoding: chunked\r\n")
            parts.append(b"\r\n")
            # A stream's head waits for its first chunk and goes out in the same write: one
            # send, and one wake-up of the client, fewer per request. The engine sends its head
            # at once and its first event after the prefill, so without the hold a burst's
            # heads are written while the burst's later requests still wait to be forwarded.
            self.head = b"".join(parts)
            self.head_timer = self.proto.loop.call_later(HEAD_HOLD_S, self.flush_head)
            return
        parts.append(b"\r\n")
        self.transport.write(b"".join(parts))


class LeanDownstream(AsgiDownstream):
    """The relay's downstream (server.downstream) for an ``Exchange``, put in the request's
    disconnect hook by the protocol: it writes body chunks itself."""

    __slots__ = ("ex",)

    def __init__(self, ex: Exchange, hook: dict[str, Any]) -> None:
        super().__init__(ex.receive, ex.send, hook)
        self.ex = ex

    def direct(self) -> Exchange | None:
        ex = self.ex
        return ex if ex.response_started and ex.chunked else None

    def paused(self) -> bool:
        return self.ex.proto.write_paused and not self.ex.disconnected

    def abort(self) -> None:
        self.ex.abort()


Handler = Callable[[Scope, Receive, Send], Coroutine[Any, Any, None]]


class Host(Protocol):
    """What the front needs of the server that runs it: server.uvicorn_adapter.UvicornHost."""

    @property
    def keep_alive_s(self) -> float: ...
    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]: ...
    def runs(self, app: object) -> bool: ...
    def opened(self, proto: asyncio.Protocol) -> None: ...
    def closed(self, proto: asyncio.Protocol) -> None: ...
    def started(self, task: asyncio.Task[None]) -> None: ...
    def finished(self, task: asyncio.Task[None]) -> None: ...
    def answered(self) -> None: ...
    def protocol(self, cls: type[asyncio.Protocol]) -> asyncio.Protocol: ...


def front_protocol(app: object, generation: Handler, fallback: type[asyncio.Protocol],
                   guards: Guards, host_of: Callable[..., Host]) -> type[asyncio.Protocol]:
    """The protocol class for uvicorn's ``http=``: ``generation`` serves the lean requests while
    uvicorn runs ``app`` bare (wrapped in middleware, e.g. under --log-level trace, everything
    goes through uvicorn); ``fallback`` (uvicorn's, with the header timeout) takes over every
    connection this one does not serve itself; ``host_of(config, server_state, app_state,
    loop)`` is what the protocol knows of the server (server.uvicorn_adapter.UvicornHost)."""

    class Front(FrontProtocol):
        pass

    Front.app = app
    Front.generation = staticmethod(generation)  # type: ignore[assignment]
    Front.fallback = fallback
    Front.guards = guards
    Front.header_timeout_s = guards.header_timeout_s
    Front.host_of = staticmethod(host_of)  # type: ignore[assignment]
    return Front


def _address(info: Any) -> tuple[str, int] | None:
    """(host, port) of a socket address as asyncio gives it; None for a Unix socket's."""
    if isinstance(info, tuple) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None


class FrontProtocol(asyncio.Protocol):
    app: object
    generation: Handler
    fallback: type[asyncio.Protocol]
    guards: Guards
    header_timeout_s: float
    host_of: Callable[..., Host]

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = _loop or asyncio.get_event_loop()
        # What this protocol needs of the server that runs it (uvicorn's, by name).
        self.host = self.host_of(config, server_state, app_state, self.loop)
        self.handler = self.generation if self.host.runs(self.app) else None
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.parser: httptools.HttpRequestParser | None = None
        self.buf = bytearray()  # received and not taken by a complete lean request
        self.fed = 0  # bytes of buf the current parser has seen
        self.exchange: Exchange | None = None  # the request being answered
        self.waiting = False  # its request is complete: later bytes wait until it is answered
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.hook = new_disconnect_hook()
        self.length = 0
        self.divert = False  # this request goes to uvicorn's protocol
        self.consumed = -1  # bytes of buf the lean request took, once complete (this feed)
        self.read_paused = False
        self.write_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.keep_alive_timer = False  # the timer is the idle keep-alive one
        self.handed_over = False
        self.head = HeadLimit(self.guards.max_header_line_bytes, self.guards.max_header_bytes)
        self.stall = StallTimer(self.loop, self.guards)
        self.refused: Refusal | None = None  # answered and closing: input dropped
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None

    def idle(self) -> bool:
        """No request in progress: nothing received of one, none being answered, not refused
        or handed to uvicorn's protocol (server.conncap closes idle connections first)."""
        return (self.exchange is None and not self.buf and self.refused is None
                and not self.handed_over)

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # The two addresses (as uvicorn's scope has them): the Host check on a public bind
        # asks whether a client is on this machine. asyncio read them when it made the
        # transport: no system call here.
        self.client = _address(transport.get_extra_info("peername"))
        self.server = _address(transport.get_extra_info("sockname"))
        self.host.opened(self)
        self._arm(self.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self.refused is not None:
            self.refused.drop(data)
            return
        if self.handed_over:  # pragma: no cover - the transport has the new protocol
            return
        self.buf += data
        if not self.head.done and not self.waiting:
            over = self.head.feed(data)
            if over is not None:
                self._refuse(431, head_too_large(self.head, over), "header_too_large")
                return
        if self.waiting:  # pipelined: parsed once the current answer is done
            if len(self.buf) > HIGH_WATER:
                self.pause_reading()
            return
        self._parse()

    def connection_lost(self, exc: Exception | None) -> None:
        self.host.closed(self)
        self._disarm()
        self.stall.resumed()
        if self.refused is not None:
            self.refused.cancel()
        ex = self.exchange
        if ex is not None and not ex.response_complete:
            ex.disconnected = True
            ex.wake()
            client_left(self.hook)
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True
        self.stall.paused(self.transport)

    def resume_writing(self) -> None:
        self.write_paused = False
        self.stall.resumed()
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    async def drain(self) -> None:
        self.drain_waiter = self.loop.create_future()
        try:
            await self.drain_waiter
        finally:
            self.drain_waiter = None

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    # -- uvicorn's server calls this -------------------------------------------------------

    def shutdown(self) -> None:
        """Graceful shutdown: close now when idle, else once the answer is complete."""
        if self.exchange is None:
            self.transport.close()
        else:
            self.exchange.keep_alive = False

    # -- parsing ---------------------------------------------------------------------------

    def _parse(self) -> None:
        if self.parser is None:
            self.parser = httptools.HttpRequestParser(self)
            self.fed = 0
        data = bytes(self.buf[self.fed:])
        self.fed = len(self.buf)
        if not data:
            return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            if self.refused is not None:
                return
            if self.consumed < 0:  # in the request being read: uvicorn answers (400, ...)
                self.divert = True
            # else in bytes after a complete lean request: they are parsed afresh later
        if self.refused is not None:
            return
        if self.divert:
            self._hand_over()
        elif self.consumed >= 0:
            if self.consumed > len(self.buf):  # framing disagrees with the parser: give up
                log.error("lean HTTP path: request framing mismatch; closing the connection")
                self.transport.close()
                return
            del self.buf[:self.consumed]
            self.parser, self.consumed, self.waiting = None, -1, True
            if len(self.buf) > HIGH_WATER:
                self.pause_reading()

    def on_message_begin(self) -> None:
        if self.consumed >= 0 or self.divert or self.refused is not None:
            return
        self.url = b""
        self.headers = []
        if self.timer is None or self.keep_alive_timer:
            self._arm(self.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        if self.consumed < 0:
            self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.consumed < 0:
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self.consumed >= 0 or self.divert or self.refused is not None:
            return
        self._disarm()
        parser = self.parser
        assert parser is not None
        path, _, query = self.url.partition(b"?")
        length, other = -1, False
        for name, value in self.headers:
            if name == b"content-length":
                length = int(value)  # llhttp accepted it: digits only, at most one
            elif name in (b"transfer-encoding", b"expect"):
                other = True  # uvicorn's: chunked bodies, and 100 Continue when it reads one
            elif name == b"upgrade" or (name == b"connection" and b"upgrade" in value.lower()):
                self._refuse(400, UPGRADE_REFUSED, "upgrade_refused")
                return
        if other:  # whatever order the headers came in
            length = -2
        if parser.should_upgrade():  # CONNECT
            self._refuse(400, UPGRADE_REFUSED, "upgrade_refused")
            return
        if lacks_host(parser.get_http_version(), self.headers):
            self._refuse(400, HOST_REQUIRED, "missing_host")
            return
        handler = self.handler
        if (handler is None or length < 0 or path not in GENERATION_PATHS
                or parser.get_method() != b"POST" or parser.get_http_version() != "1.1"):
            self.divert = True
            return
        self.length = length
        ex = self.exchange = Exchange(self, parser.should_keep_alive())
        if length == 0:
            ex.more_body = False
        hook = self.hook = new_disconnect_hook()
        hook["downstream"] = LeanDownstream(ex, hook)
        hook["body_buffered"] = ex.body_buffered
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "scheme": "http", "method": "POST",
            "path": path.decode("latin-1"), "raw_path": path, "root_path": "",
            "query_string": query, "headers": self.headers, "server": self.server,
            "client": self.client,
            "extensions": {DISCONNECT_HOOK: hook},
        }
        task = self.loop.create_task(handler(scope, ex.receive, ex.send))
        task.add_done_callback(lambda t: self._task_done(t, ex))
        self.host.started(task)

    def on_body(self, body: bytes) -> None:
        ex = self.exchange
        if ex is None or self.consumed >= 0 or self.divert:
            return
        ex.body += body
        if len(ex.body) > HIGH_WATER:
            self.pause_reading()
        ex.wake()

    def on_message_complete(self) -> None:
        ex = self.exchange
        if ex is None or self.consumed >= 0 or self.divert:
            return
        ex.more_body = False
        ex.wake()
        buf, start = self.buf, 0
        while start < len(buf) and buf[start] in b"\r\n":  # llhttp skips blank lines first
            start += 1
        self.consumed = buf.find(_HEAD_END, start) + len(_HEAD_END) + self.length

    # -- the end of an exchange -------------------------------------------------------------

    def response_done(self, ex: Exchange) -> None:
        self.host.answered()
        if not ex.keep_alive or ex.more_body or self.transport.is_closing():
            self.transport.close()  # an unread request body cannot be skipped safely
            return
        self.exchange = None
        self.waiting = False
        self.head.reset()
        self.resume_reading()
        if self.buf:  # a pipelined request: after this task step, not inside its send()
            self.loop.call_soon(self._next)
        else:
            self._arm(self.host.keep_alive_s, keep_alive=True)

    def _next(self) -> None:
        if (self.waiting or self.handed_over or self.refused is not None
                or self.transport.is_closing()):
            return
        over = self.head.feed(bytes(self.buf))  # the pipelined head, not bounded while it waited
        if over is not None:
            self._refuse(431, head_too_large(self.head, over), "header_too_large")
            return
        self._parse()

    def _refuse(self, status: int, message: str, code: str) -> None:
        self._disarm()
        target = request_target(self.url, bytes(self.buf[:8192]))
        if self.guards.on_refused is not None:
            self.guards.on_refused(status, target)
        self.buf.clear()
        self.read_paused = False
        self.refused = refuse(self.transport, self.loop, self.host.default_headers,
                              status, message, code, target)

    def _task_done(self, task: asyncio.Task[None], ex: Exchange) -> None:
        self.host.finished(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            log.error("lean HTTP path: %s: %s", type(exc).__name__, exc)
        if ex.response_complete or ex.disconnected:
            return
        ex.flush_head()  # a started answer ends as it did without the hold: head, then close
        if not ex.response_started:
            ex.keep_alive = False
            if task.cancelled():  # the server's, past --drain-timeout, before any answer
                status, extra = 503, [(b"retry-after", b"5")]
                body = json.dumps(error_body(SHUTDOWN_MESSAGE, "server_error",
                                             "engine_unavailable", None)).encode()
            else:
                status, extra = 500, []
                body = json.dumps(error_body("internal error in the proxy; see its log",
                                             "internal_error", None, None)).encode()
            with contextlib.suppress(Exception):
                ex._start(status, [(b"content-type", b"application/json"),
                                   (b"content-length", str(len(body)).encode()), *extra])
                self.transport.write(body)
        self.transport.close()  # the answer cannot be completed: the client must see an end

    # -- hand-over to uvicorn --------------------------------------------------------------

    def _hand_over(self) -> None:
        self.handed_over = True
        self._disarm()
        self.stall.resumed()
        self.host.closed(self)
        other = self.host.protocol(self.fallback)
        self.resume_reading()
        other.connection_made(self.transport)
        self.transport.set_protocol(other)
        if self.write_paused:
            other.pause_writing()
        data, self.buf = bytes(self.buf), bytearray()
        if data:
            other.data_received(data)

    # -- timers: the request head's deadline, then the idle keep-alive wait -----------------

    def _arm(self, delay: float, keep_alive: bool = False) -> None:
        self._disarm()
        self.timer = self.loop.call_later(delay, self._expire)
        self.keep_alive_timer = keep_alive

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        self.timer = None
        if self.exchange is None and not self.handed_over and self.refused is None:
            self.transport.close()
