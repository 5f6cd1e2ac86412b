"""ASGI types the proxy's modules share, and its one scope extension."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# ASGI scope extension {"callbacks": [...], "left": bool}, offered by server.serve's and
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


def client_left(hook: dict[str, Any]) -> None:
    """The protocol's side: the client's connection dropped during this request."""
    hook["left"] = True
    for callback in list(hook["callbacks"]):
        callback()
