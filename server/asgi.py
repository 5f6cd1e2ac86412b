"""ASGI types the proxy's modules share, its one scope extension, and the relay's downstream
(server.downstream) over plain ASGI."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from server.downstream import ChunkWriter

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# ASGI scope extension {"callbacks": [...], "left": bool}, offered by server.uvicorn_adapter's and
# server.front's protocols: they call the callbacks when the client's connection drops, and set
# "left" for a request that registers after that. The relay then needs no task per request
# blocked in receive() just to learn of a disconnect; without the extension, such a task watches.
DISCONNECT_HOOK = "toposerve.on_disconnect"


def disconnect_hook(scope: Mapping[str, object]) -> dict[str, Any] | None:
    extensions = scope.get("extensions")
    ext = extensions.get(DISCONNECT_HOOK) if isinstance(extensions, dict) else None
    return ext if isinstance(ext, dict) and isinstance(ext.get("callbacks"), list) else None


def new_disconnect_hook() -> dict[str, Any]:
    """A fresh hook for one request's scope (what a protocol offering the extension puts there)."""
    return {"callbacks": [], "left": False}


def body_buffered(hook: dict[str, Any] | None) -> bool:
    """Whether the serving protocol says the request's whole body is held (it put a
    ``body_buffered`` callable in the hook: server.front, server.uvicorn_adapter)."""
    held = hook.get("body_buffered") if hook is not None else None
    return bool(held()) if held is not None else False


def client_left(hook: dict[str, Any]) -> None:
    """The protocol's side: the client's connection dropped during this request."""
    hook["left"] = True
    for callback in list(hook["callbacks"]):
        callback()


class AsgiDownstream:
    """server.downstream.Downstream over ASGI ``receive``/``send``, under any ASGI server.

    The client's leaving comes from the disconnect-hook extension when the server offers it,
    else from a small task waiting in ``receive()`` for ``http.disconnect``."""

    __slots__ = ("hook", "receive", "send", "watcher")

    def __init__(self, receive: Receive, send: Send, hook: dict[str, Any] | None) -> None:
        self.receive = receive
        self.send = send
        self.hook = hook
        self.watcher: asyncio.Task[None] | None = None

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        extra = self.hook.get("response_headers") if self.hook is not None else None
        if extra:  # the app's own (CORS for an allowed origin: server.app.ProxyApp.with_cors)
            headers = [*headers, *extra]
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def write(self, data: bytes) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        await self.send({"type": "http.response.body", "body": data})

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        hook = self.hook
        if hook is None:
            self.watcher = asyncio.create_task(_watch_disconnect(self.receive, callback))
            return
        if hook.get("left"):
            callback()
        hook["callbacks"].append(callback)

    def direct(self) -> ChunkWriter | None:
        return None  # ``send`` is a coroutine: nothing to write from a callback

    def paused(self) -> bool:
        return False  # ASGI does not say: a silent stream is the engine's, as before

    def abort(self) -> None:
        pass  # ASGI has no abort: the app returns without ending the response, and the server
        # closes the connection

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
        if self.hook is not None:
            self.hook["callbacks"].clear()  # one request per scope: nothing else registers


async def _watch_disconnect(receive: Receive, callback: Callable[[], None]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            callback()
            return
