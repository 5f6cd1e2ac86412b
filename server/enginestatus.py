"""Why no engine answers, as the launcher that runs them knows it: a multi-node engine group
with a node down, or restarting. The launcher writes one small JSON file (``--engine-status-
file``, replaced whole by a rename) and the proxy reads it only when it is about to answer 503
for want of an engine, so the client's error names what is wrong instead of a generic line:

    {"state": "node_down" | "restarting", "message": "node 1 of the 2-node engine group is down"}

No file, an empty object, or anything else unreadable: the generic 503. The launcher writes
only ranks and counts (never a node's address or a process id): the message is shown to any
client.
"""

from __future__ import annotations

import os

from server.errors import EngineGroupNodeDown, EngineGroupRestarting, UpstreamUnavailable
from topocommon import jsontext

STATES: dict[str, type[UpstreamUnavailable]] = {
    "node_down": EngineGroupNodeDown,
    "restarting": EngineGroupRestarting,
}
MAX_BYTES = 4096
MAX_MESSAGE = 300
RETRY_HINT = "; retry after the Retry-After delay"


def parse(raw: bytes) -> UpstreamUnavailable | None:
    """Pure: the error the file describes, or None for anything else."""
    if len(raw) > MAX_BYTES:
        return None
    try:
        data = jsontext.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    kind, message = STATES.get(str(data.get("state"))), data.get("message")
    if kind is None or not isinstance(message, str):
        return None
    text = " ".join(message.split())[:MAX_MESSAGE]
    if not text or not text.isprintable():
        return None
    return kind(text + RETRY_HINT)


class EngineStatus:
    """The launcher's status file, read again only when it changed."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._error: UpstreamUnavailable | None = None

    def error(self) -> UpstreamUnavailable | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._seen:
                with open(self.path, "rb") as f:
                    self._error = parse(f.read(MAX_BYTES + 1))
                self._seen = stamp
        except OSError:
            self._seen, self._error = None, None
        if self._error is None:
            return None
        return type(self._error)(self._error.message)  # a new one per answer: raised apart
