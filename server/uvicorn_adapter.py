"""Every use of uvicorn's internals by the relay, in one place: the relay's downstream
(server.downstream) under the two servers this proxy runs.

- server.front's lean path: its ``Exchange`` is the ASGI ``receive``/``send``, and writes
  token events itself once a chunked response started.
- uvicorn's httptools protocol: its ``RequestResponseCycle`` is; a body chunk is written
  straight to its transport, framed as its ``send`` frames it. That reads private attributes
  (``response_started``, ``chunked_encoding``, ``disconnected``, ``response_complete``,
  ``flow.write_paused``, ``transport``), all checked when the writer is made: a uvicorn that
  renamed one gets no direct writer, and every chunk goes through ``send`` (tested with a bare
  cycle; pyproject pins uvicorn to the tested releases).

Under any other server (or ``send`` wrapped by middleware) the relay gets plain
``server.asgi.AsgiDownstream``.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from server.asgi import AsgiDownstream, Receive, Send
from server.downstream import ChunkWriter, Downstream
from server.front import Exchange


def downstream_for(receive: Receive, send: Send, hook: dict[str, Any] | None) -> Downstream:
    """The relay's downstream for this request's ``receive``/``send``."""
    owner = getattr(send, "__self__", None)
    if type(owner) is Exchange:
        return LeanDownstream(receive, send, hook)
    if type(owner) is RequestResponseCycle:
        return CycleDownstream(receive, send, hook)
    return AsgiDownstream(receive, send, hook)


class LeanDownstream(AsgiDownstream):
    """server.front's ``Exchange``: it writes body chunks itself."""

    __slots__ = ()

    def direct(self) -> ChunkWriter | None:
        ex: Exchange = self.send.__self__  # type: ignore[attr-defined]
        return ex if ex.response_started and ex.chunked else None


class CycleDownstream(AsgiDownstream):
    """uvicorn's httptools ``RequestResponseCycle``."""

    __slots__ = ()

    def direct(self) -> ChunkWriter | None:
        return CycleWriter.of(self.send)


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
