"""Loadgen's HTTP/1.1 client for streamed POSTs, built for timing accuracy, on the one client
connection the proxy and the benchmark client use too (topocommon.http1).

Each response body piece is stamped with `perf_counter()` inside `data_received`, the first
Python code that runs when the socket becomes readable (topocommon.http1.TimedConnection), and
stored as raw bytes; nothing is decoded while the stream runs, and the waiting coroutine wakes
once per response, not once per token. That keeps the loop's work per token to one C-level
parse (httptools, the parser uvicorn uses) and one list append, so the loop stays responsive
at thousands of streams. The shared connection bounds the response head, skips interim 1xx
answers, drops trailers and reads close-delimited bodies; what is loadgen's own is here.

Keep-alive connections are pooled; a pooled connection that the server closed while idle is
replaced once, transparently, since the server never saw the request. (The proxy does not send
a POST twice, since its client's request is not its own to repeat; a benchmark's is.)
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from loadgen.timing import RawRequest
from topocommon import http1

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


class _Connection(http1.TimedConnection):
    """One keep-alive connection; records one response at a time."""

    def begin(self) -> _Recorder:
        recorder = _Recorder(self)
        self.start(recorder, "POST")
        return recorder


class _Recorder:
    """One response's arrival times and raw body pieces (a topocommon.http1.Reader)."""

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.pieces: list[tuple[float, bytes]] = []
        self.status = 0
        self.received = False  # any byte of an answer: the server saw the request
        self.complete = False
        self.keep_alive = False
        self.t_done = 0.0
        self.t_headers: float | None = None
        self.waiter: asyncio.Future[str | None] = conn.loop.create_future()

    def on_head(self, status: int, headers: http1.Headers, keep_alive: bool) -> None:
        self.status, self.keep_alive, self.t_headers = status, keep_alive, self.conn.t

    def on_body(self, body: bytes) -> None:
        self.pieces.append((self.conn.t, body))

    def on_complete(self) -> None:
        self.complete = True
        self._finish(None)

    def on_lost(self, error: http1.BadResponse | None) -> None:
        self._finish(str(error) if error is not None
                     else "connection closed by server before the response ended")

    def _finish(self, error: str | None) -> None:
        self.t_done = self.conn.t
        self.received = self.received or bool(self.conn.head_bytes) or self.status != 0
        if not self.waiter.done():
            self.waiter.set_result(error)


class Client:
    """Sends prepared requests over pooled connections and returns raw timings."""

    def __init__(self, endpoint: Endpoint, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._idle: http1.IdleConnections[_Connection] = http1.IdleConnections(_IDLE_REUSE_S)
        self._ssl = ssl.create_default_context() if endpoint.tls else None

    async def send(self, index: int, payload: bytes, scheduled: float | None = None) -> RawRequest:
        conn, reused = await self._acquire()
        if isinstance(conn, str):
            now = time.perf_counter()
            return RawRequest(index, sent=now, done=now, error=conn, scheduled=scheduled)
        raw, received = await self._exchange(index, conn, payload, scheduled)
        if reused and not received and raw.error is not None:
            # The server closed the idle connection as we wrote: it never saw this request.
            fresh, _ = await self._acquire(fresh=True)
            if isinstance(fresh, str):
                return RawRequest(
                    index, sent=raw.sent, done=raw.done, error=fresh, scheduled=scheduled
                )
            raw, _ = await self._exchange(index, fresh, payload, scheduled)
        return raw

    async def _exchange(
        self, index: int, conn: _Connection, payload: bytes, scheduled: float | None
    ) -> tuple[RawRequest, bool]:
        rec = conn.begin()
        assert conn.transport is not None
        sent = time.perf_counter()
        conn.transport.write(payload)
        try:
            error = await asyncio.wait_for(rec.waiter, self.timeout_s)
        except TimeoutError:
            conn.abort()
            error = f"timed out after {self.timeout_s:g} s (raise --timeout)"
            rec.t_done = time.perf_counter()
        raw = RawRequest(
            index=index,
            sent=sent,
            done=rec.t_done,
            status=rec.status,
            headers_at=rec.t_headers,
            pieces=tuple(rec.pieces),
            error=error,
            scheduled=scheduled,
        )
        conn.detach()
        if rec.complete and rec.keep_alive and not conn.closed:
            self._idle.put(conn)
        else:
            conn.abort()
        return raw, rec.received

    async def _acquire(self, fresh: bool = False) -> tuple[_Connection | str, bool]:
        conn = None if fresh else self._idle.take()
        if conn is not None:
            return conn, True
        loop = asyncio.get_running_loop()
        try:
            _, new = await loop.create_connection(
                _Connection, self.endpoint.host, self.endpoint.port, ssl=self._ssl
            )
        except OSError as exc:
            where = f"{self.endpoint.host}:{self.endpoint.port}"
            return f"cannot connect to {where}: {exc.strerror or exc}", False
        return new, False

    def close(self) -> None:
        self._idle.close()
