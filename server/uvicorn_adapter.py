"""Every use of uvicorn's internals, in one place (uvicorn's public ``Config``/``Server`` are
used by server.serve; pyproject pins uvicorn to the releases the contract tests passed with).

- The relay's downstream (server.downstream) for uvicorn's httptools protocol, whose
  ``RequestResponseCycle`` is, a body chunk then being written straight to its transport as its
  ``send`` frames it; ``guarded_protocol`` puts it in each request's disconnect hook, where the
  relay takes it (server.front's lean protocol puts its own, ``LeanDownstream``). That reads
  private attributes (``response_started``, ``chunked_encoding``, ``disconnected``,
  ``response_complete``, ``flow.write_paused``, ``transport``), all checked when the writer is
  made: a uvicorn that renamed one gets no direct writer, and every chunk goes through ``send``
  (tested with a bare cycle). Under any other server the relay gets plain
  ``server.asgi.AsgiDownstream``.
- ``cycle_body_buffered``: whether a request's whole body is already held (the app then reads
  it without a timer), injected in the disconnect hook as the downstream is.
- ``UvicornHost``: what server.front's protocol needs of the uvicorn server running it.
- ``guarded_protocol``: uvicorn's httptools protocol with server.front's guards (header
  timeout, bounded heads, refused upgrades, stalled clients) and the disconnect hook.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from server.asgi import (
    DISCONNECT_HOOK,
    AsgiDownstream,
    Send,
    client_left,
    disconnect_hook,
    new_disconnect_hook,
)
from server.downstream import ChunkWriter
from server.front import (
    HOST_REQUIRED,
    INVALID_HTTP,
    TRANSFER_CODING,
    UPGRADE_REFUSED,
    Guards,
    HeadLimit,
    Refusal,
    StallTimer,
    foreign_coding,
    head_too_large,
    lacks_host,
    refuse,
    request_target,
    wants_upgrade,
)

log = logging.getLogger("toposerve")


class CycleDownstream(AsgiDownstream):
    """uvicorn's httptools ``RequestResponseCycle``, put in the request's disconnect hook by
    ``guarded_protocol`` (so a route reached through FastAPI, whose ``send`` wraps the
    cycle's, still gets it)."""

    __slots__ = ()

    def abort(self) -> None:
        cycle = self.send.__self__  # type: ignore[attr-defined]
        try:
            cycle.keep_alive = False
            cycle.transport.abort()
        except AttributeError:  # a uvicorn that renamed them: returning unended closes it
            pass

    def direct(self) -> ChunkWriter | None:
        return CycleWriter.of(self.send)

    def paused(self) -> bool:
        cycle = self.send.__self__  # type: ignore[attr-defined]
        try:
            return bool(cycle.flow.write_paused and not cycle.disconnected)
        except AttributeError:  # a uvicorn that renamed them: the relay's old reading
            return False


class CycleWriter:
    """Body chunks written straight to uvicorn's transport, exactly as its ``send`` would.

    uvicorn's ``send`` for a body chunk checks the cycle's state, frames the chunk and writes
    it; as a coroutine called per token, with its message dict, that is a good part of the
    proxy's per-token cost. Only once the response started with chunked encoding (not HEAD);
    anything else gets None and goes through ``send``.
    """

    __slots__ = ("cycle", "transport")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self.cycle = cycle
        self.transport = cycle.transport

    @classmethod
    def of(cls, send: Send) -> CycleWriter | None:
        cycle = getattr(send, "__self__", None)
        if type(cycle) is not RequestResponseCycle:
            return None
        try:
            usable = (cycle.response_started and cycle.chunked_encoding is True
                      and cycle.scope["method"] != "HEAD")
            # Everything ready() and write() touch, read once here: a uvicorn release that
            # renamed any of it falls back to ``send`` instead of failing mid-stream.
            _ = (cycle.disconnected, cycle.response_complete, cycle.flow.write_paused,
                 cycle.transport.write)
        except (AttributeError, KeyError):
            return None
        return cls(cycle) if usable else None

    def ready(self) -> bool:
        """What uvicorn's ``send`` would write at once: not paused (it would await), not gone."""
        cycle = self.cycle
        return not (cycle.disconnected or cycle.response_complete or cycle.flow.write_paused)

    def write(self, data: bytes) -> None:
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))


def cycle_body_buffered(cycle: RequestResponseCycle) -> bool:
    """Whether uvicorn's cycle holds the request's whole body (the next receive() will not
    wait); ``guarded_protocol`` puts it in each request's disconnect hook."""
    try:
        return not cycle.more_body and not cycle.disconnected
    except AttributeError:  # a uvicorn that renamed them: take the general path
        return False


class UvicornHost:
    """What server.front's protocol needs of the uvicorn server that runs it, by name.

    uvicorn builds an ``http=`` protocol as ``cls(config=, server_state=, app_state=, _loop=)``
    and expects it to keep ``server_state``'s connection and task sets and request count (its
    graceful shutdown and limits read them), to send ``default_headers`` (the date it refreshes
    every second) and to honour ``config.timeout_keep_alive``; a connection handed to uvicorn's
    own protocol is built the same way."""

    __slots__ = ("app_state", "config", "loop", "state")

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 loop: asyncio.AbstractEventLoop) -> None:
        if not config.loaded:
            config.load()
        self.config = config
        self.state = server_state
        self.app_state = app_state
        self.loop = loop

    def runs(self, app: object) -> bool:
        """Whether uvicorn serves ``app`` itself (not wrapped in middleware)."""
        return self.config.loaded_app is app

    @property
    def keep_alive_s(self) -> float:
        return float(self.config.timeout_keep_alive)

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        return self.state.default_headers  # type: ignore[no-any-return]

    def opened(self, proto: asyncio.Protocol) -> None:
        self.state.connections.add(proto)

    def closed(self, proto: asyncio.Protocol) -> None:
        self.state.connections.discard(proto)

    def started(self, task: asyncio.Task[None]) -> None:
        self.state.tasks.add(task)

    def finished(self, task: asyncio.Task[None]) -> None:
        self.state.tasks.discard(task)

    def answered(self) -> None:
        self.state.total_requests += 1

    def protocol(self, cls: type[asyncio.Protocol]) -> asyncio.Protocol:
        """A fresh ``cls`` (uvicorn's protocol) for a connection handed over to it."""
        return cls(config=self.config, server_state=self.state,  # type: ignore[call-arg]
                   app_state=self.app_state, _loop=self.loop)


# Requests a connection may have read and queued behind the one being answered. uvicorn parses
# every request of a read at once (llhttp cannot be paused from Python) and queues each with its
# cycle, scope and event, about 5 KB: one 256 KiB read of pipelined GETs held ~30 MB, for as
# long as the client did not read. nginx reads the next request only once one is answered; here
# the queue is bounded instead: past it the parser is stopped, the queued requests are answered
# and the connection is then closed (a pipelining client sends the rest again, RFC 9112 9.3.2).
MAX_PIPELINED = 16


class _PipelineFull(Exception):
    """Raised inside the parser: the connection has MAX_PIPELINED requests queued."""


class _Deferred:
    """A refusal of a pipelined request whose earlier requests are still being answered
    (``GuardedProtocol._refuse``): written once they all are. Until then nothing more is
    parsed, and what the client sends is dropped (reading is paused, but uvicorn's flow
    control may resume it)."""

    __slots__ = ("code", "message", "status", "target")

    def __init__(self, status: int, message: str, code: str, target: str) -> None:
        self.status, self.message, self.code, self.target = status, message, code, target

    def drop(self, data: bytes) -> None:
        pass

    def cancel(self) -> None:
        pass


FRAMING_TOO_LARGE = (
    "the request's chunked body sent {n} bytes in a row that were not body (chunk size lines, "
    "chunk extensions, trailer fields), over the limit of {limit}; send the body with a "
    "Content-Length, or in chunks without extensions or trailers")


def guarded_protocol(guards: Guards) -> type[asyncio.Protocol]:
    timeout_s = guards.header_timeout_s

    class GuardedProtocol(HttpToolsProtocol):
        """uvicorn's protocol, closing a connection whose request headers do not arrive
        within ``timeout_s``, bounding request heads, refusing upgrades and cutting off a
        client that stops reading (the same rules as server.front's)."""

        _header_timer: asyncio.TimerHandle | None = None
        _refused: Refusal | _Deferred | None = None
        _pipeline_full = False  # no more requests are read: the queued ones end the connection
        # A request's body being read (headers complete, message not): what llhttp hands on
        # from it, and how many bytes in a row came that were not body (see data_received).
        _in_body = False
        _heads = 0  # request heads parsed on this connection
        _body_fed = 0
        _framing_run = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head = HeadLimit(guards.max_header_line_bytes, guards.max_header_bytes)
            self._stall = StallTimer(self.loop, guards)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def idle(self) -> bool:
            """No request in progress (server.conncap closes idle connections first): the
            last response complete, no byte of a next head received, not refused."""
            cycle = self.cycle  # uvicorn's private state, read here with the rest of it
            return bool(self._refused is None and (cycle is None or cycle.response_complete)
                        and self._head.total == 0 and not self._head.done)

        def data_received(self, data: bytes) -> None:
            if self._refused is not None:
                self._refused.drop(data)
                return
            # Counted before httptools sees the bytes. The head is known to start after the
            # previous request's end, so the first chunk of a pipelined head can go uncounted:
            # the bound is looser by at most one read, never absent.
            over = self._head.feed(data)
            if over is not None:
                self._refuse(431, head_too_large(self._head, over), "header_too_large", data)
                return
            in_body, heads, self._body_fed = self._in_body, self._heads, 0
            super().data_received(data)
            self._bound_framing(in_body, self._heads - heads, len(data))
            # uvicorn stops its keep-alive timer on any byte, and arms nothing until a request
            # begins: bytes that begin none (a lone CRLF, which llhttp skips) would leave an
            # idle connection without a timer for ever. Between requests, the header timer runs.
            cycle = self.cycle
            if (self._header_timer is None and self._refused is None
                    and (cycle is None or cycle.response_complete)
                    and getattr(self, "timeout_keep_alive_task", None) is None):
                self._arm()

        def _bound_framing(self, began_in_body: bool, new_heads: int, size: int) -> None:
            """A chunked body's bytes that are not body (size lines, extensions, trailer
            fields) are bounded like a head: llhttp buffers none of it, but httptools joins
            a trailer value's pieces and uvicorn keeps every trailer field, so an endless
            trailer section grew the proxy by about 500 MB a second, before any key was
            asked. Counted per read that ends inside a request's body and carried no body
            byte: a read wholly inside that body adds its size, the read that ended its head
            what came after the head. A read with body bytes starts the count again: where
            in it they lay is not known, so the bound is looser by at most one read (256
            KiB), never absent."""
            if not self._in_body or self._body_fed or self._refused is not None:
                self._framing_run = 0
                return
            if began_in_body and not new_heads:
                self._framing_run += size
            elif not began_in_body and new_heads == 1 and self._head.end >= 0:
                self._framing_run = size - self._head.end  # the head's own bytes are bounded
            else:  # a request ended in this read and another began: its head is not placed
                self._framing_run = 0
                return
            limit = guards.max_header_bytes + guards.max_header_line_bytes
            if self._framing_run <= limit:
                return
            message = FRAMING_TOO_LARGE.format(n=self._framing_run, limit=limit)
            cycle = self.cycle
            if cycle is not None and cycle.response_started:  # no second answer: cut it
                log.info("cut off a request: %s", message)
                self._in_body = False
                self.transport.abort()
                return
            if cycle is not None:
                # The app runs already (since the head): it must not answer after the
                # refusal (uvicorn's send would write past its end, a traceback per request):
                # as for a client gone, its sends are dropped and its receive() says so.
                cycle.disconnected = True
                cycle.message_event.set()
            self._refuse(431, message, "header_too_large")

        def _refuse(self, status: int, message: str, code: str, head: bytes = b"") -> None:
            self._disarm()
            target = request_target(self.url, head)
            if guards.on_refused is not None:  # once, whether written now or deferred
                guards.on_refused(status, target)
            cycle = self.cycle
            if self._in_body:  # its head was read: it is the newest cycle, queued or running
                queued = bool(self.pipeline) and self.pipeline[0][0] is cycle
                if queued:  # it never runs: its refusal is its answer
                    self.pipeline.popleft()
                earlier = queued
            else:  # no cycle of its own: the newest is an earlier request's
                earlier = cycle is not None and not cycle.response_complete
            if earlier:
                # A pipelined request refused (its head too large, not HTTP, an upgrade, its
                # chunked framing) while an earlier one is still being answered or queued:
                # written now, the refusal landed inside that answer (a streamed one was cut
                # by a 431 in the middle of its chunks, and its next write failed, a 500 in
                # the log). As nginx, which reads the next request only once one is answered:
                # the refusal waits for every earlier answer (on_response_complete).
                log.info("a pipelined request is refused once the answers before it are "
                         "complete: %d %s", status, message)
                self._refused = _Deferred(status, message, code, target)
                self.transport.pause_reading()
                return
            self._refused = refuse(self.transport, self.loop, self.server_state.default_headers,
                                   status, message, code, target)

        def on_response_complete(self) -> None:
            queued = bool(self.pipeline)  # uvicorn starts the next one queued, if any
            super().on_response_complete()
            deferred = self._refused
            if (not isinstance(deferred, _Deferred) or self.transport.is_closing()
                    or queued):
                return  # nothing waits, the client asked to close, or more answers are due
            keep_alive = getattr(self, "timeout_keep_alive_task", None)
            if keep_alive is not None:  # armed by uvicorn just now: the refusal closes instead
                keep_alive.cancel()
                self.timeout_keep_alive_task = None
            self._refused = refuse(self.transport, self.loop, self.server_state.default_headers,
                                   deferred.status, deferred.message, deferred.code,
                                   deferred.target)

        def send_400_response(self, msg: str) -> None:
            if self._pipeline_full:  # the parser was stopped on purpose: nothing to answer
                return
            # uvicorn's answer to a request llhttp refuses is plain text, closed at once (which
            # can reset the answer away while the client still sends): here the route's error
            # format and the refusal's lingering close. uvicorn calls this inside its
            # ``except HttpParserError``, so the parser's reason is the exception being handled.
            why = sys.exc_info()[1]
            self._refuse(400, INVALID_HTTP.format(why=why or msg), "invalid_http")

        def _unsupported_upgrade_warning(self) -> None:
            if self._refused is None:  # pragma: no cover - every upgrade is refused first
                super()._unsupported_upgrade_warning()

        def on_message_begin(self) -> None:
            if self._refused is not None:
                return
            super().on_message_begin()
            if self._header_timer is None:  # a new connection's first request: armed already
                self._arm()

        def on_headers_complete(self) -> None:
            if self._refused is not None:
                return
            self._disarm()
            cycle = self.cycle
            if (cycle is not None and not cycle.response_complete
                    and len(self.pipeline) >= MAX_PIPELINED):
                self._pipeline_full = True
                self.flow.pause_reading()
                self.pipeline[0][0].keep_alive = False  # the last one queued closes it
                log.info("a client pipelined over %d requests: the queued ones are answered, "
                         "then its connection is closed", MAX_PIPELINED)
                raise _PipelineFull
            if lacks_host(self.parser.get_http_version(), self.headers):
                self._refuse(400, HOST_REQUIRED, "missing_host")
                return
            coding = foreign_coding(self.headers)  # server.front hands every coded body here
            if coding is not None:
                self._refuse(501, TRANSFER_CODING.format(coding=coding),
                             "unsupported_transfer_encoding")
                return
            if self.url[:1] not in (b"/", b"*"):
                self._host_from_target()
            if self.parser.should_upgrade() or wants_upgrade(self.headers):
                self._refuse(400, UPGRADE_REFUSED, "upgrade_refused")
                return
            # A fresh scope per request (made in on_message_begin): the relay registers there
            # what to call if the client leaves, instead of a task waiting on receive().
            extensions: dict[str, Any] = self.scope.setdefault("extensions", {})  # type: ignore[assignment]
            hook = extensions[DISCONNECT_HOOK] = new_disconnect_hook()
            super().on_headers_complete()
            self._in_body = True
            self._heads += 1
            # The relay's downstream over the cycle's own send (server.relay.Relay.handle):
            # direct writes on routes that reach it through FastAPI, whose send wraps it.
            cycle = self.cycle
            if cycle is not None and cycle.scope is self.scope:
                hook["downstream"] = CycleDownstream(
                    cycle.receive, cycle.send, hook)  # type: ignore[arg-type]
                hook["body_buffered"] = functools.partial(cycle_body_buffered, cycle)

        def _host_from_target(self) -> None:
            """An absolute-form target (``POST http://name/v1/... HTTP/1.1``): RFC 9112 3.2.2
            says to ignore ``Host`` and take the target's authority, so that is the Host the
            app (and its local-serving check) sees. uvicorn keeps the header and the target's
            name is lost, which let a target naming any host pass a Host check on loopback."""
            try:
                parsed = httptools.parse_url(self.url)
                name = parsed.host or b""
            except (httptools.HttpParserInvalidURLError, ValueError):
                parsed, name = None, b""
            authority = b"[%b]" % name if b":" in name else name
            if parsed is not None and parsed.port:
                authority += b":%d" % parsed.port
            # In place: uvicorn's scope holds this very list.
            self.headers[:] = [*(h for h in self.headers if h[0] != b"host"), (b"host", authority)]

        def on_header(self, name: bytes, value: bytes) -> None:
            # After the head, a field is a chunked body's trailer: uvicorn would append it to
            # the scope's headers, which the app has read already (the Host, Origin and key
            # checks) and the relay forwards when the body is in. RFC 9110 6.5.1 lets a
            # recipient drop trailer fields; nothing here reads them.
            if not self._in_body:
                super().on_header(name, value)

        def on_body(self, body: bytes) -> None:
            self._body_fed += len(body)
            if self._refused is None:
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._in_body = False
            if self._refused is None:
                super().on_message_complete()
                self._head.reset()

        def pause_writing(self) -> None:
            super().pause_writing()
            self._stall.paused(self.transport)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._stall.resumed()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._stall.resumed()
            if self._refused is not None:
                self._refused.cancel()
            cycle = self.cycle
            super().connection_lost(exc)
            # uvicorn marks only the running cycle, and only before its response completed:
            # exactly when its receive() would have answered http.disconnect.
            hook = disconnect_hook(cycle.scope) if cycle is not None else None
            if cycle is not None and cycle.disconnected and hook is not None:
                client_left(hook)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            if self.cycle is None or self.cycle.response_complete:
                self.transport.close()

    return GuardedProtocol
