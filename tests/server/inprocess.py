"""An in-process engine for relay tests (server.upstream.Connector), as httpx's MockTransport:
the proxy's engine connection is fed the bytes a handler yields, with no process or socket, so a
test of the relay's logic needs no engine where exact timing is not the point.

``InProcessEngine(handler)``: ``handler(request_bytes)`` is an async iterator of the response's
raw bytes (status line, headers, body, any framing, right or wrong); it may sleep between
yields. The proxy closing the connection cancels it (``aborted`` counts those): what a real
engine sees as the client's abort.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

Handler = Callable[[bytes], AsyncIterator[bytes]]


class _Pipe(asyncio.Transport):
    def __init__(self, engine: InProcessEngine, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self.engine = engine
        self.protocol = protocol
        self.request = b""
        self.closing = False
        self.task: asyncio.Task[None] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.request += bytes(data)
        head, sep, body = self.request.partition(b"\r\n\r\n")
        if not sep or self.task is not None:
            return
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(body) >= length:
            whole, self.request = self.request[:len(head) + 4 + length], b""
            self.engine.requests.append(whole)
            self.task = asyncio.get_running_loop().create_task(self._answer(whole))

    async def _answer(self, request: bytes) -> None:
        try:
            async for chunk in self.engine.handler(request):
                if self.closing:
                    return
                self.protocol.data_received(chunk)
            self.task = None
        except asyncio.CancelledError:
            self.engine.aborted += 1
            raise

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.abort()

    def abort(self) -> None:
        if self.closing:
            return
        self.closing = True
        if self.task is not None and not self.task.done():
            self.task.cancel()
        asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def pause_reading(self) -> None:
        pass  # a handler's bytes are small test data: nothing to hold back

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


@dataclass
class InProcessEngine:
    handler: Handler
    requests: list[bytes] = field(default_factory=list)
    aborted: int = 0
    connections: int = 0

    async def connect(self, factory: Callable[[], asyncio.Protocol], host: str,
                      port: int) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
        self.connections += 1
        protocol = factory()
        transport = _Pipe(self, protocol)
        protocol.connection_made(transport)
        return transport, protocol


@dataclass
class RecordingDownstream:
    """server.downstream.Downstream that records what the client would get."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    ended: bool = False
    aborted: bool = False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status, self.headers = status, headers

    async def write(self, data: bytes) -> None:
        self.body += data

    async def end(self, data: bytes = b"") -> None:
        self.body += data
        self.ended = True

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        pass

    def direct(self) -> None:
        return None

    def paused(self) -> bool:
        return False

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        pass
