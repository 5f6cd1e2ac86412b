"""Inspection of an OpenAI/vLLM Server-Sent Events stream as it passes through (pure).

The proxy forwards upstream bytes unchanged; it only needs to know, per event, whether it
carries a token (for TTFT/ITL), is the final usage chunk (token counts, and dropped when the
proxy asked for it on the client's behalf), ``[DONE]``, an error, or malformed. Events are
recognised by bytes, not JSON, so a token costs a few ``in`` tests; only the usage chunk is
parsed. A trailing partial event is held back until its end arrives (a client cannot use half
an event anyway), so what is forwarded is always whole events, byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_EVENT_BYTES = 4 * 1024 * 1024
_ROLE_ONLY = b'"delta":{"role":"assistant","content":""},'


@dataclass
class Scan:
    """What one ``feed`` found; ``forward`` is what the client must receive."""

    forward: bytes
    tokens: int = 0
    done: bool = False
    error: bool = False
    malformed: bool = False
    usage: tuple[int, int] | None = None


class SseInspector:
    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.pending = b""
        self.done = False
        self.broken = False

    def feed(self, data: bytes) -> Scan:
        if not self.pending and data.find(b"\n\n") == len(data) - 2:
            return self._one(data)  # the usual case: exactly one whole event per read
        if self.pending:
            data = self.pending + data
            self.pending = b""
        end = data.rfind(b"\n\n")
        if end < 0:
            self.pending = data
            return Scan(b"", malformed=self._too_big())
        if end + 2 < len(data):
            self.pending = data[end + 2:]
            data = data[: end + 2]
        scan = Scan(data)
        kept: list[bytes] = []
        dropped = False
        for event in data[:-2].split(b"\n\n"):
            if self._classify(event, scan):
                kept.append(event)
            else:
                dropped = True
            if scan.malformed:
                self.broken = True
                kept.pop()
                dropped = True
                break
        if dropped:
            scan.forward = b"".join(e + b"\n\n" for e in kept)
        scan.malformed = scan.malformed or self._too_big()
        self.done = self.done or scan.done
        return scan

    def plain_token(self, data: bytes) -> bool:
        """True when ``data`` is exactly one whole token event, forwarded unchanged: what
        ``feed`` would find (one token, nothing else) without its ``Scan``, and no state to
        update. Anything else (a role, usage, error or non-data event, several events, a
        partial one) is False, and goes through ``feed``.

        Slices and ``in`` rather than ``find``/``startswith``: those bytes methods parse their
        arguments as a format string on every call, which shows per token.
        """
        return (not self.pending and data[-3:] == b"}\n\n" and data[:7] == b"data: {"
                and b"\n\n" not in data[:-2] and b'"choices":[]' not in data
                and _ROLE_ONLY not in data and data[7:14] != b'"error"')

    def _one(self, data: bytes) -> Scan:
        scan = Scan(data)
        if not self._classify(data[:-2], scan) or scan.malformed:
            scan.forward = b""
        self.broken = scan.malformed
        self.done = self.done or scan.done
        return scan

    def _too_big(self) -> bool:
        if len(self.pending) > MAX_EVENT_BYTES:
            self.broken = True
            return True
        return False

    def _classify(self, event: bytes, scan: Scan) -> bool:
        """Record what ``event`` is in ``scan``; False when it must not be forwarded."""
        if event.startswith(b"data: {") and event.endswith(b"}"):
            if b'"choices":[]' in event and b'"usage":' in event:
                scan.usage = parse_usage(event[6:])
                return not self.strip_usage
            if event.startswith(b'data: {"error"'):
                scan.error = True
            elif not (_ROLE_ONLY in event and event.count(b'"index":') == 1):
                scan.tokens += 1
            return True
        if event == b"data: [DONE]":
            scan.done = True
            return True
        if event == b"" or event.startswith((b":", b"event:", b"id:", b"retry:")):
            return True
        scan.malformed = True
        return True


def parse_usage(payload: bytes) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) of a usage chunk, None if it is not one."""
    try:
        usage = json.loads(payload).get("usage") or {}
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    except (ValueError, AttributeError, TypeError):
        return None


def usage_of_body(body: bytes) -> tuple[int, int] | None:
    """Token counts of a non-streamed JSON answer's ``usage``, None when absent."""
    return parse_usage(body) if b'"usage"' in body else None
