"""A lean HTTP/1.1 client for the engine: keep-alive pool, httptools parsing, no per-chunk tasks.

The relay's hot path reads every token event through this; a general client (aiohttp) costs a
few hundred microseconds per request and a stream-reader wake-up per chunk, which at 256
streams on two shared cores is the difference between keeping up and falling behind.

Errors:
    UpstreamError                 base
    ├── ConnectFailed             nothing was sent: safe to try another replica
    └── ConnectionBroken          the connection ended before the response did
        ├── ResponseTooLarge      a non-streamed answer over ``Pool.max_response_bytes``
        └── BadResponse           not an HTTP answer the proxy can relay (see below)

The connection (reading the head within bounds, interim responses, trailers, close-delimited
answers, HEAD) is the one loadgen and the benchmark client use too: topocommon.http1, where
what each does with a response head is written. What is the proxy's own is here: the pool's
replay rule, back-pressure on a slow client, the body limit, and the read-callback sink.

Why hand-written rather than httpx/httpcore or aiohttp: measured side by side (issue 25,
docs/benchmarks-proxy.md), both cost the 256-stream case far more TTFT than this client (bare
proxies differing only in the engine client); and the relay writes token events from this
client's read callback (``Response.sink``), which a stream-reader API cannot offer.

A request goes out on a pooled idle connection when one is alive, and is sent again (once, on
a fresh connection) only when it provably never reached the engine — the idle connection was
seen closed before any byte was written — or when it is replayable (GET, HEAD, OPTIONS without a
body): a POST the engine may have read is never sent twice (docs/proxy.md).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from urllib.parse import urlsplit

from topocommon import http1

HIGH_WATER = 256 * 1024  # buffered bytes at which reading from the engine pauses (slow client)
# An idle connection older than this is closed, not reused: uvicorn (vLLM's server) closes idle
# keep-alive connections after 5 s, and a request written as that close crosses it is lost.
IDLE_REUSE_S = 4.0
REUSE_MARGIN_S = 1.0  # how much sooner than the engine closes it an idle connection is retired


def reuse_window(engine_keep_alive_s: float) -> float:
    """How long an idle connection is reused, for an engine that closes idle connections after
    ``engine_keep_alive_s`` (--upstream-keep-alive): 1 s less, so that a request is never
    written as the engine's close crosses it; at least a tenth of it for very short ones.

    It matters for bursts seconds apart (agent turns, benchmark rounds): a connection opened
    anew costs the proxy some 300 µs of CPU a request more than a pooled one (256 streams of
    512-id prompts, docs/benchmarks-proxy.md), which an engine kept alive longer (vLLM with
    VLLM_HTTP_TIMEOUT_KEEP_ALIVE) saves."""
    return max(engine_keep_alive_s - REUSE_MARGIN_S, engine_keep_alive_s / 10)
REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})
MAX_HEAD_BYTES = http1.MAX_HEAD_BYTES


class UpstreamError(Exception):
    pass


class ConnectFailed(UpstreamError):
    pass


class ConnectionBroken(UpstreamError):
    pass


class ResponseTooLarge(ConnectionBroken):
    pass


class BadResponse(ConnectionBroken):
    """The engine's answer is not HTTP the proxy can relay (topocommon.http1.BadResponse: a
    head over MAX_HEAD_BYTES, a 101, a status outside 100-599, bytes the parser refuses before
    the head ended)."""


class _Conn(http1.ClientConnection):
    PEER = "the engine"


class Response:
    """One engine response; body chunks are read as they arrive."""

    def __init__(self, conn: _Conn, pool: Pool) -> None:
        self.conn = conn
        self.pool = pool
        self.status = 0
        self.keep_alive = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.broken = False
        self.error: UpstreamError | None = None  # what broke it, when it is known
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        # Set by the relay: takes a body chunk right in the read callback (True: consumed), so
        # a token event costs no task wake-up; False, or chunks already queued, means queue it.
        self.sink: Callable[[bytes], bool] | None = None

    @property
    def content_length(self) -> int | None:
        """The engine's Content-Length (llhttp accepted at most one, digits only), else None."""
        for name, value in self.headers:
            if name == b"content-length":
                return int(value)
        return None

    @property
    def content_type(self) -> bytes:
        for name, value in self.headers:
            if name == b"content-type":
                return value.split(b";", 1)[0].strip().lower()
        return b""

    # -- fed by the connection (topocommon.http1.Reader) -------------------------------------

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def on_head(self, status: int, headers: http1.Headers, keep_alive: bool) -> None:
        self.status, self.headers, self.keep_alive = status, headers, keep_alive
        self._wake()

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        if sink is not None and not self.chunks and sink(body):
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.conn.transport is not None:
            self.paused = True
            self.conn.transport.pause_reading()
        self._wake()

    def on_complete(self) -> None:
        self.complete = True
        self._wake()

    def on_lost(self, error: http1.BadResponse | None) -> None:
        if error is not None:
            self.error = self.error or BadResponse(str(error))
        if not self.complete:
            self.broken = True
        self._wake()

    async def wait(self) -> None:
        """Until something changes: a chunk queued, the end, a break, or a ``_wake``."""
        await self._wait()

    def take(self) -> bytes:
        """Every queued chunk as one (b"" when none), resuming a paused read."""
        if not self.chunks:
            return b""
        data = b"".join(self.chunks) if len(self.chunks) > 1 else self.chunks[0]
        self.chunks.clear()
        self.buffered = 0
        if self.paused and self.conn.transport is not None:
            self.paused = False
            self.conn.transport.resume_reading()
        return data

    async def _wait(self) -> None:
        self.waiter = self.conn.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    # -- read by the relay -----------------------------------------------------------------

    async def wait_headers(self) -> None:
        while not self.status:
            if self.broken:
                raise self.error or ConnectionBroken(
                    "the engine closed the connection before answering")
            await self._wait()

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        while True:
            if self.chunks:
                yield self.take()
                continue
            if self.complete:
                return
            if self.broken:
                raise ConnectionBroken("the engine broke off its answer")
            await self._wait()

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body, at most ``limit`` (default ``Pool.max_response_bytes``) of it (else
        ResponseTooLarge, and the connection is closed)."""
        limit = self.pool.max_response_bytes if limit is None else limit
        for name, value in self.headers:
            if name == b"content-length" and value.strip().isdigit() and int(value) > limit:
                self.conn.abort()
                raise ResponseTooLarge(f"the engine's answer is {int(value)} bytes, over the "
                                       f"{limit}-byte limit (--max-response-bytes)")
        chunks, size = [], 0
        async for chunk in self.iter_chunks():
            size += len(chunk)
            if size > limit:
                self.conn.abort()
                raise ResponseTooLarge(f"the engine's answer is over the {limit}-byte limit "
                                       "(--max-response-bytes)")
            chunks.append(chunk)
        return b"".join(chunks)

    def finish(self) -> None:
        """Back to the pool when read to the end on a keep-alive connection, else closed (which
        is what makes the engine abort a request the client gave up on)."""
        self.conn.detach()
        self.sink = None
        if self.complete and self.keep_alive and not self.conn.closed and not self.chunks:
            self.pool.release(self.conn)
        else:
            self.conn.abort()


# How a Pool opens a connection: ``loop.create_connection``'s shape (protocol factory, host,
# port). The default is TCP; tests pass an in-process engine (as httpx's MockTransport), which
# feeds the connection's protocol the bytes an engine would send, with no process or socket.
Connector = Callable[[Callable[[], asyncio.Protocol], str, int],
                     Awaitable[tuple[asyncio.BaseTransport, asyncio.Protocol]]]


async def tcp_connect(factory: Callable[[], asyncio.Protocol], host: str,
                      port: int) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
    return await asyncio.get_running_loop().create_connection(factory, host, port)


class Pool:
    """Keep-alive connections to one engine."""

    def __init__(self, base_url: str, connect_timeout_s: float,
                 api_key: str | None = None, connect: Connector = tcp_connect,
                 idle_reuse_s: float = IDLE_REUSE_S) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http":
            raise ValueError(f"only http:// engines are supported, got {base_url}")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.netloc = parts.netloc
        self.connect_timeout_s = connect_timeout_s
        self.max_response_bytes = 64 * 1024 * 1024  # set from --max-response-bytes
        self.idle: http1.IdleConnections[_Conn] = http1.IdleConnections(idle_reuse_s)
        self.connect = connect
        # the engine's own key (--upstream-api-key) on every request, control-plane GETs too
        self.auth = (("authorization", f"Bearer {api_key}"),) if api_key else ()

    def release(self, conn: _Conn) -> None:
        self.idle.put(conn)

    async def _connect(self) -> _Conn:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await self.connect(_Conn, self.host, self.port)
        except (OSError, TimeoutError) as exc:
            raise ConnectFailed(f"cannot connect to {self.netloc}: {exc}") from None
        assert isinstance(conn, _Conn)
        return conn

    async def request(self, method: str, target: str, headers: Sequence[tuple[str, str]],
                      body: bytes) -> Response:
        """Send a request; returns once the response headers arrived."""
        payload = http1.request_bytes(method, target, self.netloc, (*self.auth, *headers), body)
        conn = self.idle.take()
        if conn is not None:
            try:
                return await self._exchange(conn, payload, method)
            except _Stale:
                # Closed by the engine after the request was written: it may have read it. Only
                # a request that can be replayed is sent again, once, on a new connection.
                if method not in REPLAYABLE or body:
                    raise ConnectionBroken(_STALE) from None
        return await self._exchange(await self._connect(), payload, method)

    async def get(self, target: str, limit: int | None = None) -> tuple[int, bytes]:
        """A control-plane GET (health, model list, metrics): the status and the whole body, at
        most ``limit`` bytes of it (default ``max_response_bytes``)."""
        resp = await self.request("GET", target, (), b"")
        try:
            body = await resp.read(limit)
        finally:
            resp.finish()
        return resp.status, body

    async def _exchange(self, conn: _Conn, payload: bytes, method: str) -> Response:
        response = Response(conn, self)
        conn.start(response, method)
        assert conn.transport is not None
        reused = conn.idle_since > 0
        conn.transport.write(payload)
        try:
            await response.wait_headers()
        except BadResponse:
            conn.detach()
            conn.abort()
            raise
        except ConnectionBroken:
            conn.detach()
            conn.abort()
            if reused and not conn.head_bytes:
                raise _Stale(_STALE) from None
            raise ConnectionBroken(_STALE if not conn.head_bytes else "broken") from None
        except BaseException:
            conn.detach()
            conn.abort()
            raise
        return response

    def close(self) -> None:
        self.idle.close()


_STALE = "the engine closed the connection before answering"


class _Stale(ConnectionBroken):
    """A reused idle connection closed after the request was written, before any answer."""
