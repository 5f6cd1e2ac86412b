"""A cap on open client connections, at accept time (as nginx's worker_connections).

Without one, idle connections hold the process's descriptors until the header timeout: 300 of
them with 256 descriptors locked every new client out. With ``ConnectionCap(limit)``, a new
connection that would go past ``limit`` first makes room by closing idle ones, the longest
silent first (accepted and silent, or kept alive between requests: nothing of theirs is lost;
nginx reuses the same two kinds; a client that keeps one connection and uses it is closed
last); only when every open connection is busy does it get a 503 with
``Retry-After`` and ``connection: close``, written at once, instead of waiting unanswered.

``capped(cls, cap)`` is the server's protocol class with the cap in front of its
``connection_made``: the count is uvicorn's ``server_state.connections`` (every protocol
adds itself there, a connection handed from one protocol to another included), and whether a
connection is idle is asked of the protocol's public ``idle()`` (server.front's and
server.uvicorn_adapter's have one); a protocol without it is busy. Refusals and idle
connections closed to make room are counted (``on_refused``, ``on_idle_closed``: the proxy's
``toposerve_connections_refused_total`` and ``toposerve_idle_connections_closed_total``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from server.errors import error_body

log = logging.getLogger("toposerve")
LINGER_S = 1.0  # a refused client's bytes are read and dropped this long, so the 503 arrives
LINGER_BYTES = 64 * 1024
DESCRIPTORS_WANTED = 65536
LOG_EVERY_S = 10.0  # refusals are logged at most this often (a flood must not flood the log)
_MESSAGE = ("the proxy has its maximum of open connections, all busy: retry shortly, reuse a "
            "keep-alive connection, or start the proxy with a larger --max-connections")


def default_limit() -> int:
    """Half the descriptors the process may open (the other half is for the engine
    connections, one per request in flight, and the proxy's own files), after raising its soft
    limit toward the hard one, to 65536 at most, as vLLM does at its start: a soft limit of
    1024 would otherwise cap a proxy that may hold 1024 requests in flight at 480."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = DESCRIPTORS_WANTED if hard == resource.RLIM_INFINITY else min(
            hard, DESCRIPTORS_WANTED)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX, or refused
        return 512
    if soft == resource.RLIM_INFINITY:
        return DESCRIPTORS_WANTED // 2
    return max(8, (soft - 64) // 2)


def is_idle(proto: object) -> bool:
    """No request in progress on ``proto``, as its own public ``idle()`` says (server.front's
    protocol and server.uvicorn_adapter's both have one); a protocol without one is busy."""
    own = getattr(proto, "idle", None)
    return bool(own()) if callable(own) else False


def _closing(proto: object) -> bool:
    transport = getattr(proto, "transport", None)
    return transport is None or bool(transport.is_closing())


class ConnectionCap:
    """Decides, per accepted connection, whether it is served (pure but for the closes)."""

    def __init__(self, limit: int, on_refused: Callable[[], None] = lambda: None,
                 on_idle_closed: Callable[[], None] = lambda: None) -> None:
        self.limit = limit
        self.refused = 0
        self.on_refused, self.on_idle_closed = on_refused, on_idle_closed
        self._logged_at = -LOG_EVERY_S
        # When each connection (by its transport's id) last received bytes or was accepted.
        self.active: dict[int, float] = {}

    def touch(self, transport: object) -> None:
        self.active[id(transport)] = time.monotonic()

    def _silent_since(self, proto: object) -> float:
        return self.active.get(id(getattr(proto, "transport", None)), 0.0)

    def admit(self, connections: Collection[Any]) -> bool:
        """Whether a new connection may join ``connections``; idle ones are closed first when
        it would go past the limit (the longest silent first, enough for one slot more)."""
        if len(self.active) > 2 * self.limit + 64:  # forget connections gone meanwhile
            ids = {id(getattr(p, "transport", None)) for p in connections}
            self.active = {k: v for k, v in self.active.items() if k in ids}
        if len(connections) < self.limit:
            return True
        live = [p for p in connections if not _closing(p)]
        if len(live) < self.limit:
            return True
        idle = sorted((p for p in live if is_idle(p)), key=self._silent_since)
        for proto in idle[:len(live) - self.limit + 1]:
            proto.transport.close()
            self.on_idle_closed()
        return len(idle) > len(live) - self.limit

    def note_refusal(self, now: float) -> None:
        self.refused += 1
        self.on_refused()
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            log.warning("%d open connections, all busy (--max-connections): new ones get 503 "
                        "(%d refused so far)", self.limit, self.refused)


def refusal_bytes(default_headers: list[tuple[bytes, bytes]]) -> bytes:
    body = json.dumps(error_body(_MESSAGE, "server_error", "too_many_connections")).encode()
    parts = [b"HTTP/1.1 503 Service Unavailable\r\n"]
    for name, value in default_headers:
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"content-type: application/json\r\ncontent-length: %d\r\nretry-after: 1\r\n"
                 b"connection: close\r\n\r\n%b" % (len(body), body))
    return b"".join(parts)


class _Refused:
    """A connection answered 503 and ending: what the client sends meanwhile is dropped (so
    that closing with unread bytes does not reset the answer away), for LINGER_S at most."""

    __slots__ = ("budget", "timer", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 answer: bytes) -> None:
        self.transport = transport
        self.budget = LINGER_BYTES
        transport.write(answer)
        try:
            transport.write_eof()
        except (NotImplementedError, RuntimeError, OSError):  # pragma: no cover - TLS
            transport.close()
        self.timer = loop.call_later(LINGER_S, transport.abort)

    def drop(self, data: bytes) -> None:
        self.budget -= len(data)
        if self.budget < 0:
            self.transport.abort()


def tracked(cls: type[asyncio.Protocol], cap: ConnectionCap) -> type[asyncio.Protocol]:
    """``cls`` noting in ``cap`` when its connection last received bytes."""

    class Tracked(cls):  # type: ignore[valid-type,misc]
        def data_received(self, data: bytes) -> None:
            cap.touch(self.transport)
            super().data_received(data)

    Tracked.__name__ = Tracked.__qualname__ = f"Tracked{cls.__name__}"
    return Tracked


def capped(cls: type[asyncio.Protocol], cap: ConnectionCap) -> type[asyncio.Protocol]:
    """``cls`` (built by uvicorn as ``cls(config=, server_state=, app_state=, _loop=)``) with
    ``cap`` deciding at ``connection_made``; the protocol it hands connections over to (its
    ``fallback``, server.front's) has its activity noted too."""

    class Capped(cls):  # type: ignore[valid-type,misc]
        _cap_refused: _Refused | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._cap_state = kwargs.get("server_state", args[1] if len(args) > 1 else None)
            self._cap_loop: asyncio.AbstractEventLoop = (
                kwargs.get("_loop") or asyncio.get_event_loop())

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            state = self._cap_state
            if state is None or cap.admit(state.connections):
                cap.touch(transport)
                super().connection_made(transport)
                return
            cap.note_refusal(self._cap_loop.time())
            self._cap_refused = _Refused(transport,  # type: ignore[arg-type]
                                         self._cap_loop, refusal_bytes(state.default_headers))

        def data_received(self, data: bytes) -> None:
            if self._cap_refused is not None:
                self._cap_refused.drop(data)
                return
            cap.touch(self.transport)
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._cap_refused is not None:
                self._cap_refused.timer.cancel()
                return
            super().connection_lost(exc)

        def eof_received(self) -> bool | None:
            if self._cap_refused is not None:
                return None
            return super().eof_received()  # type: ignore[no-any-return]

    if isinstance(getattr(cls, "fallback", None), type):
        Capped.fallback = tracked(cls.fallback, cap)  # type: ignore[attr-defined]
    Capped.__name__ = Capped.__qualname__ = f"Capped{cls.__name__}"
    return Capped
