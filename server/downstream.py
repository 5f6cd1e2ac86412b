"""The client's side of one relayed request: the only thing server.relay knows of the HTTP
server it runs under.

server.relay writes a response through a ``Downstream`` and learns of the client's leaving
from it; the implementations live with the servers: ``server.asgi.AsgiDownstream`` for any
ASGI server, and ``server.uvicorn_adapter`` for the two this proxy runs under (uvicorn's
httptools cycle and the lean front, server.front), which add ``direct()``: the per-token write
from the engine connection's read callback, with no task or coroutine per token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class ChunkWriter(Protocol):
    """Synchronous body writes of a started chunked response, for the relay's read callback."""

    def ready(self) -> bool:
        """Whether ``Downstream.write`` would write a chunk at once (not paused, not gone)."""

    def write(self, data: bytes) -> None:
        """Write one body chunk exactly as ``Downstream.write`` would."""


class Downstream(Protocol):
    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Send the status line and headers (no content-length: chunked)."""

    async def write(self, data: bytes) -> None:
        """Send one body chunk, more to follow; waits while the client's socket is full."""

    async def end(self, data: bytes = b"") -> None:
        """Send the last body bytes; the response is complete."""

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once, on the loop) when the client leaves before the response is
        complete; at once if it has left already."""

    def direct(self) -> ChunkWriter | None:
        """After ``start``: a synchronous writer for body chunks, or None (use ``write``)."""

    def paused(self) -> bool:
        """Whether the server has stopped writing to the client's socket because it took
        nothing (its write buffer is full); False where the server does not say."""

    def abort(self) -> None:
        """Cut the client's connection: a started response cannot be completed (HTTP's only
        way to say it is incomplete). Where the server offers none, returning without ending
        the response makes the ASGI server close the connection."""

    def close(self) -> None:
        """The request is over: stop watching for the client's leaving."""
