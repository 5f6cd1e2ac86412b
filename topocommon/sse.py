"""One incremental Server-Sent Events reader (pure), for the clients that read a stream whole:
the benchmark client (simengine.client) and loadgen.

Fed the body's bytes as they arrive, in any pieces, it returns the events completed by them,
each as ``Event(name, data)``: lines end in CR, LF or CRLF (a CRLF split between two pieces is
one line end), ``field: value`` drops one leading space, ``data`` lines join with LF, a blank
line dispatches, an event with no ``data`` line is dropped (the SSE rules, WHATWG HTML 9.2.6).
``id`` and ``retry`` are not kept: no client here reconnects.

The proxy does not use it: it forwards the engine's bytes as they are and recognises a token
event by a few byte tests per chunk (server.sse), a narrower job at a far higher rate.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    name: bytes  # b"message" unless an ``event:`` line named it
    data: bytes


class SseReader:
    __slots__ = ("after_cr", "data", "name", "partial")

    def __init__(self) -> None:
        self.partial = b""  # the current line, not ended yet
        self.after_cr = False  # the last piece ended in CR: an LF first is its CRLF's end
        self.data: list[bytes] = []
        self.name = b""

    def feed(self, piece: bytes) -> list[Event]:
        if self.after_cr and piece[:1] == b"\n":
            piece = piece[1:]
        self.after_cr = piece[-1:] == b"\r"
        lines = (self.partial + piece).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self.partial = lines.pop()
        events: list[Event] = []
        for line in lines:
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def finish(self) -> list[Event]:
        """At the end of the body: the last event even without its blank line (SSE would drop
        it; a client measuring a server counts what it was sent, as loadgen always has)."""
        if self.partial:
            self._line(self.partial)
            self.partial = b""
        event = self._line(b"")
        return [event] if event is not None else []

    def _line(self, line: bytes) -> Event | None:
        if not line:
            if not self.data:
                self.name = b""
                return None
            event = Event(self.name or b"message", b"\n".join(self.data))
            self.data, self.name = [], b""
            return event
        field, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            self.data.append(value)
        elif field == b"event":
            self.name = value
        return None
