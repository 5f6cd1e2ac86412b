"""A minimal HTTP/1.1 client for streamed POSTs, built for timing accuracy.

Each response body piece is stamped with `perf_counter()` inside `data_received`, the first
Python code that runs when the socket becomes readable, and stored as raw bytes; nothing is
decoded while the stream runs, and the waiting coroutine wakes once per response, not once
per token. That keeps the loop's work per token to one C-level parse (httptools, the parser
uvicorn uses) and one list append, so the loop stays responsive at thousands of streams.

Keep-alive connections are pooled; a pooled connection that the server closed while idle is
replaced once, transparently, since the server never saw the request.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from loadgen.timing import RawRequest

# Servers (uvicorn: 5 s) close idle keep-alive connections; do not reuse one near that age.
_IDLE_REUSE_S = 3.0


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    tls: bool
    base_path: str  # path prefix of the URL, without trailing slash

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        return cls(parts.hostname, port, tls, parts.path.rstrip("/"))

    @property
    def authority(self) -> str:
        default = 443 if self.tls else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


def request_bytes(endpoint: Endpoint, path: str, body: bytes, api_key: str | None) -> bytes:
    """The whole HTTP request, built before the clock starts."""
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    head = (
        f"POST {endpoint.base_path}{path} HTTP/1.1\r\n"
        f"Host: {endpoint.authority}\r\n"
        "User-Agent: toposerve-loadgen\r\n"
        "Content-Type: application/json\r\n"
        "Accept: text/event-stream\r\n"
        f"{auth}Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


class _Connection(asyncio.Protocol):
    """One keep-alive connection; records one response at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = time.perf_counter()
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.pieces: list[tuple[float, bytes]] = []
        self.status = 0
        self.received = False
        self.complete = False
        self.keep_alive = False
        self.t = 0.0
        self.t_done = 0.0
        self.t_headers: float | None = None
        self.waiter: asyncio.Future[str | None] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.t = time.perf_counter()
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(f"malformed HTTP response: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self.t = time.perf_counter()
            reason = f": {exc}" if exc else ""
            self._finish(f"connection closed by server before the response ended{reason}")

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.t_headers = self.t

    def on_body(self, body: bytes) -> None:
        self.pieces.append((self.t, body))

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._finish(None)

    def _finish(self, error: str | None) -> None:
        self.t_done = self.t
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(error)

    # driving
    def start(self, payload: bytes) -> tuple[float, asyncio.Future[str | None]]:
        self._reset()
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        sent = time.perf_counter()
        self.transport.write(payload)
        return sent, self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Client:
    """Sends prepared requests over pooled connections and returns raw timings."""

    def __init__(self, endpoint: Endpoint, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._idle: list[_Connection] = []
        self._ssl = ssl.create_default_context() if endpoint.tls else None

    async def send(self, index: int, payload: bytes, scheduled: float | None = None) -> RawRequest:
        conn, reused = await self._acquire()
        if isinstance(conn, str):
            now = time.perf_counter()
            return RawRequest(index, sent=now, done=now, error=conn, scheduled=scheduled)
        raw = await self._exchange(index, conn, payload, scheduled)
        if reused and not conn.received and raw.error is not None:
            # The server closed the idle connection as we wrote: it never saw this request.
            fresh, _ = await self._acquire(fresh=True)
            if isinstance(fresh, str):
                return RawRequest(
                    index, sent=raw.sent, done=raw.done, error=fresh, scheduled=scheduled
                )
            raw = await self._exchange(index, fresh, payload, scheduled)
        return raw

    async def _exchange(
        self, index: int, conn: _Connection, payload: bytes, scheduled: float | None
    ) -> RawRequest:
        sent, waiter = conn.start(payload)
        try:
            error = await asyncio.wait_for(waiter, self.timeout_s)
        except TimeoutError:
            conn.close()
            error = f"timed out after {self.timeout_s:g} s (raise --timeout)"
            conn.t_done = time.perf_counter()
        raw = RawRequest(
            index=index,
            sent=sent,
            done=conn.t_done,
            status=conn.status,
            headers_at=conn.t_headers,
            pieces=tuple(conn.pieces),
            error=error,
            scheduled=scheduled,
        )
        self._release(conn)
        return raw

    async def _acquire(self, fresh: bool = False) -> tuple[_Connection | str, bool]:
        now = time.perf_counter()
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < _IDLE_REUSE_S:
                return conn, True
            conn.close()
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(
                _Connection, self.endpoint.host, self.endpoint.port, ssl=self._ssl
            )
        except OSError as exc:
            where = f"{self.endpoint.host}:{self.endpoint.port}"
            return f"cannot connect to {where}: {exc.strerror or exc}", False
        return conn, False

    def _release(self, conn: _Connection) -> None:
        if conn.complete and conn.keep_alive and not conn.closed:
            conn.idle_since = time.perf_counter()
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
