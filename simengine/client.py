"""A lean raw-asyncio streaming client that records arrival times, for benchmarks and timing tests.

It speaks just enough HTTP/1.1 (one request per connection, chunked or sized bodies) to time
Server-Sent Events without a heavyweight client library eating the cores it shares with the
engine and the proxy. Token events are recognised by bytes, not JSON: a ``data:`` event is a
token unless it is ``[DONE]``, a usage-only chunk (``"choices":[]``), an error or the bare role
chunk (``"delta":{"role":"assistant","content":""}``). Named events (``event:`` then
``data:``: /v1/messages, /v1/responses) are tokens when they are text deltas
(``content_block_delta``, ``response.output_text.delta``); ``message_stop`` and
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

from topocommon.sse import SseReader

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


class _ChunkDecoder:
    """Incremental HTTP/1.1 chunked-transfer decoder."""

    def __init__(self) -> None:
        self.buf = b""
        self.need = -1
        self.finished = False

    def feed(self, data: bytes) -> bytes:
        self.buf += data
        out = []
        while not self.finished:
            if self.need < 0:
                line, sep, rest = self.buf.partition(b"\r\n")
                if not sep:
                    break
                self.need = int(line.split(b";")[0], 16)
                self.buf = rest
                if self.need == 0:
                    self.finished = True
                    break
            if len(self.buf) < self.need + 2:
                break
            out.append(self.buf[: self.need])
            self.buf = self.buf[self.need + 2:]
            self.need = -1
        return b"".join(out)


# The timeout is a parameter (ASYNC109 would have the caller wrap the call) because running out
# of time is a result here, a failed request that a benchmark counts, not an exception to handle.
async def stream(url: str, body: dict[str, object], headers: Sequence[tuple[str, str]] = (),
                 timeout: float = 120.0) -> StreamResult:  # noqa: ASYNC109
    """POST ``body`` to ``url`` and time every token event of the streamed answer."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    head = [f"POST {parts.path or '/'} HTTP/1.1", f"host: {parts.netloc}",
            "content-type: application/json", f"content-length: {len(payload)}",
            "connection: close", *(f"{k}: {v}" for k, v in headers)]
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + payload
    t_sent = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            return await _exchange(parts.hostname or "127.0.0.1", parts.port or 80, request,
                                   t_sent)
    except (TimeoutError, OSError, ValueError) as exc:
        return StreamResult(0, t_sent, (), time.perf_counter(), False,
                            f"{type(exc).__name__}: {exc}", 0)


async def _exchange(host: str, port: int, request: bytes, t_sent: float) -> StreamResult:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        raw_head = await reader.readuntil(b"\r\n\r\n")
        status = int(raw_head.split(b" ", 2)[1])
        chunked = b"transfer-encoding: chunked" in raw_head.lower()
        decoder = _ChunkDecoder() if chunked else None
        times: list[float] = []
        sse = SseReader()  # the SSE reader loadgen shares (topocommon.sse)
        first = b""  # the body's start, for an error answer's message
        events, done, error = 0, False, None
        while True:
            data = await reader.read(65536)
            now = time.perf_counter()
            if not data:
                break
            data = decoder.feed(data) if decoder else data
            if len(first) < 200:
                first += data[:200]
            for event in sse.feed(data):
                name, payload = event.name, event.data
                events += 1
                if name != b"message":  # named: /v1/messages, /v1/responses
                    done = done or name in _LAST_EVENTS
                    if name == b"error":
                        error = payload.decode(errors="replace")
                    if name in _TOKEN_EVENTS:
                        times.append(now)
                    continue
                done = done or payload == b"[DONE]"
                if payload.startswith(b'{"error"'):
                    error = payload.decode(errors="replace")
                times.extend([now] * count_tokens(payload))
            if decoder is not None and decoder.finished:
                break
        if status != 200 and error is None:
            error = f"HTTP {status}: {first[:200].decode(errors='replace')}"
        elif decoder is not None and not decoder.finished and error is None:
            error = "stream ended before the last chunk"
        return StreamResult(status, t_sent, tuple(times), time.perf_counter(), done, error,
                            events)
    finally:
        writer.close()


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
