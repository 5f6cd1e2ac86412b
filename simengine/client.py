"""A lean streaming client that records arrival times, for benchmarks and timing tests.

One request per connection, on the HTTP/1.1 client connection the proxy and loadgen use
(topocommon.http1: each read stamped before it is parsed, the head bounded, interim answers
skipped, chunked, sized or close-delimited bodies), its events read by the SSE reader loadgen
uses (topocommon.sse), so that timing Server-Sent Events costs the cores it shares with the
engine and the proxy no heavyweight client library. Token events are recognised by bytes, not
JSON: a ``data:`` event is a token unless it is ``[DONE]``, a usage-only chunk
(``"choices":[]``), an error or the bare role chunk (``"delta":{"role":"assistant","content":""}``).
Named events (``event:`` then ``data:``: /v1/messages, /v1/responses) are tokens when they are
text deltas (``content_block_delta``, ``response.output_text.delta``); ``message_stop`` and
``response.completed`` end the stream as ``[DONE]`` does, and ``error`` is an error.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from topocommon import http1, quantiles
from topocommon.sse import Event, SseReader

_ROLE_ONLY = b'"delta":{"role":"assistant","content":""},'
_TOKEN_EVENTS = frozenset({b"content_block_delta", b"response.output_text.delta"})
_LAST_EVENTS = frozenset({b"message_stop", b"response.completed", b"response.incomplete"})


@dataclass(frozen=True)
class StreamResult:
    status: int
    t_sent: float
    token_times: tuple[float, ...]
    t_end: float
    done: bool
    error: str | None
    events: int

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.t_sent if self.token_times else None

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]


def count_tokens(payload: bytes) -> int:
    """1 if an SSE data payload carries a generated token, else 0 (see module docstring)."""
    if payload == b"[DONE]" or b'"choices":[]' in payload or payload.startswith(b'{"error"'):
        return 0
    if _ROLE_ONLY in payload and payload.count(b'"index":0') == 1:
        return 0
    return 1


# The timeout is a parameter (ASYNC109 would have the caller wrap the call) because running out
# of time is a result here, a failed request that a benchmark counts, not an exception to handle.
async def stream(url: str, body: dict[str, object], headers: Sequence[tuple[str, str]] = (),
                 timeout: float = 120.0) -> StreamResult:  # noqa: ASYNC109
    """POST ``body`` to ``url`` and time every token event of the streamed answer."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    request = http1.request_bytes("POST", parts.path or "/", parts.netloc, (
        ("content-type", "application/json"), ("connection", "close"), *headers), payload)
    t_sent = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            return await _exchange(parts.hostname or "127.0.0.1", parts.port or 80, request,
                                   t_sent)
    except (TimeoutError, OSError, ValueError) as exc:
        return StreamResult(0, t_sent, (), time.perf_counter(), False,
                            f"{type(exc).__name__}: {exc}", 0)


class _Timer:
    """Times one streamed answer's token events as its body arrives (a topocommon.http1.Reader,
    called in the read callback: each piece carries the time its read was stamped)."""

    def __init__(self, conn: http1.TimedConnection) -> None:
        self.conn = conn
        self.status = 0
        self.times: list[float] = []
        self.sse = SseReader()
        self.first = b""  # the body's start, for an error answer's message
        self.events = 0
        self.done = False
        self.error: str | None = None
        self.ended: asyncio.Future[str | None] = conn.loop.create_future()

    def on_head(self, status: int, headers: http1.Headers, keep_alive: bool) -> None:
        self.status = status

    def on_body(self, body: bytes) -> None:
        if len(self.first) < 200:
            self.first += body[:200]
        self._events(self.sse.feed(body))

    def _events(self, events: list[Event]) -> None:
        now = self.conn.t
        for event in events:
            name, payload = event.name, event.data
            self.events += 1
            if name != b"message":  # named: /v1/messages, /v1/responses
                self.done = self.done or name in _LAST_EVENTS
                if name == b"error":
                    self.error = payload.decode(errors="replace")
                if name in _TOKEN_EVENTS:
                    self.times.append(now)
                continue
            self.done = self.done or payload == b"[DONE]"
            if payload.startswith(b'{"error"'):
                self.error = payload.decode(errors="replace")
            self.times.extend([now] * count_tokens(payload))

    def on_complete(self) -> None:
        self._events(self.sse.finish())
        self._end(None)

    def on_lost(self, error: http1.BadResponse | None) -> None:
        self._events(self.sse.finish())
        self._end(str(error) if error is not None else "stream ended before the last chunk")

    def _end(self, error: str | None) -> None:
        if not self.ended.done():
            self.ended.set_result(error)


async def _exchange(host: str, port: int, request: bytes, t_sent: float) -> StreamResult:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(http1.TimedConnection, host, port)
    assert isinstance(conn, http1.TimedConnection)
    assert conn.transport is not None
    timer = _Timer(conn)
    conn.start(timer, "POST")
    try:
        conn.transport.write(request)
        broke = await timer.ended
        error = timer.error
        if timer.status != 200 and error is None:
            error = (f"HTTP {timer.status}: {timer.first[:200].decode(errors='replace')}"
                     if timer.status else broke)
        elif broke is not None and error is None:
            error = broke
        return StreamResult(timer.status, t_sent, tuple(timer.times), time.perf_counter(),
                            timer.done, error, timer.events)
    finally:
        conn.abort()


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return float("nan")
    return quantiles.percentile(sorted(values), q)
