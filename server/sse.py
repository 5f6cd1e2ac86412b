"""Inspection of an OpenAI/vLLM Server-Sent Events stream as it passes through (pure).

The proxy forwards upstream bytes unchanged; it only needs to know, per event, whether it
carries a token (for TTFT/ITL), is the final usage chunk (token counts, and dropped when the
proxy asked for it on the client's behalf), ``[DONE]``, an error, or malformed. A token costs a
few ``in`` tests on its bytes; only an event whose bytes could be something else is parsed as
JSON: one that mentions ``usage`` (the usage chunk, in whatever spacing the engine writes JSON),
``"role"`` (the role-only first chunk, when not in vLLM's compact spelling), or, when the usage
chunk is to be dropped, a choice's non-null ``finish_reason``. A trailing partial event is held
back until its end arrives (a client cannot use half an event anyway), so what is forwarded is
always whole events, byte for byte.

When the proxy asked for usage on the client's behalf, what the client receives is what the
engine would have sent it without usage: vLLM then stamps ``system_fingerprint`` on each
choice's last chunk (the one with ``finish_reason``) instead of on the usage chunk. So the
events from the first such chunk on are held until the usage chunk arrives (in the same read,
or the next, as vLLM writes them back to back), and released with that field spliced in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from topocommon import jsontext

MAX_EVENT_BYTES = 4 * 1024 * 1024
# Held back at most this much (several choices streaming after the first one ended, or an
# engine that never sends the usage chunk): then released unchanged, and nothing held again.
MAX_HELD_BYTES = 64 * 1024
_ROLE_ONLY = b'"delta":{"role":"assistant","content":""},'
_NULL_FINISH = (b'"finish_reason":null', b'"finish_reason": null')
_COMPACT_NULL_TEXT = _NULL_FINISH[0].decode()  # vLLM's spelling
# Fields vLLM puts on each choice's last chunk when usage is not asked for, and on the usage
# chunk instead when it is: what a client that did not ask must still see.
TERMINAL_FIELDS = ("system_fingerprint",)


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
        self.keep_last = not strip_usage
        self.pending = b""
        self.done = False
        self.broken = False
        # Events held back (strip_usage only) from a choice's last chunk until the usage chunk;
        # each with whether it is such a last chunk (the fields go there).
        self.held: list[tuple[bytes, bool]] = []
        self.held_bytes = 0
        # Usage seen only on chunks that also carry choices (some servers' last chunk, or each
        # chunk under continuous_usage_stats): counted at [DONE] unless a usage chunk came.
        self.choice_usage: tuple[int, int] | None = None
        self.usage_chunk_seen = False
        self.carry_cr = False  # the last read ended in CR: an LF next is its CRLF's second half

    def feed(self, data: bytes) -> Scan:
        if self.carry_cr or b"\r" in data:
            # Engines whose SSE library ends lines with CRLF (sse-starlette: llama-cpp-python,
            # text-generation-webui), or bare CR, are read, and forwarded, with LF endings.
            data = self._lf(data)
            if not data:
                return Scan(b"")
        # The usual case: exactly one whole event per read (and not a 1-byte read, whose
        # find() of -1 equals len - 2).
        if not self.pending and data.find(b"\n\n") == len(data) - 2 and len(data) > 1:
            return self._one(data)
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
        out: list[bytes] = []
        changed = False
        for event in data[:-2].split(b"\n\n"):
            instead = self._classify(event, scan)
            if scan.malformed:  # it and what follows are not forwarded; what was held is
                self.broken = True
                changed = True
                out.append(instead or b"")
                break
            if instead is None:
                out.append(event + b"\n\n")
            else:
                out.append(instead)
                changed = True
        if changed:
            scan.forward = b"".join(out)
        scan.malformed = scan.malformed or self._too_big()
        self.done = self.done or scan.done
        return scan

    def _lf(self, data: bytes) -> bytes:
        # A CR ends a line whether or not an LF follows (SSE allows CR, LF and CRLF): it is
        # an LF at once, and an LF starting the next read, its CRLF's second half, is dropped.
        if self.carry_cr and data[:1] == b"\n":
            data = data[1:]
        self.carry_cr = data[-1:] == b"\r"
        return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def plain_token(self, data: bytes) -> bool:
        """True when ``data`` is exactly one whole token event, forwarded unchanged: what
        ``feed`` would find (one token, nothing else) without its ``Scan``, and no state to
        update. Anything else (a role, usage, error or non-data event, several events, a
        partial one, a CR anywhere, a choice's last chunk while usage is stripped) is False,
        and goes through ``feed``.

        The tests run on the event's text (latin-1: one character per byte, so each test
        means what it would on the bytes): in CPython 3.11 ``needle in some_bytes`` first tries
        the needle as an integer and builds and clears a TypeError on every call, and
        ``find``/``startswith`` parse their arguments as a format string, while ``str``'s
        ``in`` and slices do neither. Measured per call on this event shape (a vLLM-like
        completions chunk, interleaved minima): 3.2-4.0 µs on the bytes, 2.1-2.2 µs on the
        text (docs/benchmarks-proxy.md).
        """
        if self.pending or self.held or self.carry_cr:
            return False
        text = str(data, "latin-1")
        return (text[-3:] == "}\n\n" and text[:7] == "data: {" and "\n\n" not in text[:-2]
                # a CR ends a line too: ``feed`` rewrites it to LF before it reads the event
                and "\r" not in text
                and "usage" not in text and '"role"' not in text
                and text[7:14] != '"error"'
                # While usage is stripped, a choice's last chunk is held (see the module).
                and (self.keep_last or _COMPACT_NULL_TEXT in text
                     or "finish_reason" not in text))

    def release(self) -> bytes:
        """The held events, unchanged: what the client gets when the stream ends without the
        usage chunk (broken, or [DONE] first)."""
        held, self.held, self.held_bytes = self.held, [], 0
        return b"".join(event + b"\n\n" for event, _ in held)

    def _one(self, data: bytes) -> Scan:
        scan = Scan(data)
        instead = self._classify(data[:-2], scan)
        if scan.malformed:
            scan.forward = instead or b""
        elif instead is not None:
            scan.forward = instead
        self.broken = scan.malformed
        self.done = self.done or scan.done
        return scan

    def _too_big(self) -> bool:
        if len(self.pending) > MAX_EVENT_BYTES:
            self.broken = True
            return True
        return False

    def _classify(self, event: bytes, scan: Scan) -> bytes | None:
        """Record what ``event`` is in ``scan``; None to forward it unchanged, else the bytes
        to forward in its place (b"" for nothing). A malformed event sets ``scan.malformed``:
        it and everything after it are not forwarded (the held events are, before it)."""
        if event[:6] == b"data: ":
            payload = event[6:]
        elif event[:5] == b"data:":
            payload = event[5:]
        else:
            if event == b"" or event.startswith((b":", b"event:", b"id:", b"retry:")):
                return self._hold(event, False) if self.held else None
            scan.malformed = True
            return self._release_before_end(scan)
        if payload == b"[DONE]":
            scan.done = True
            if not self.usage_chunk_seen and self.choice_usage is not None:
                scan.usage = self.choice_usage
            return self._release_before_end(scan, event)
        if payload[:1] != b"{" or payload[-1:] != b"}":
            scan.malformed = True
            return self._release_before_end(scan)
        obj: dict[str, Any] | None = None
        if b"usage" in payload:
            obj = _object(payload)
            if obj is not None and isinstance(obj.get("usage"), dict) and obj.get("choices"):
                # forwarded as it is; the latest (cumulative) counts are kept for [DONE]
                self.choice_usage = usage_counts(obj["usage"]) or self.choice_usage
            elif obj is not None and isinstance(obj.get("usage"), dict):
                scan.usage = usage_counts(obj["usage"])
                self.usage_chunk_seen = True
                if not self.strip_usage:
                    return None
                held, self.held, self.held_bytes = self.held, [], 0
                return b"".join(_with_fields(e, obj) if last else e + b"\n\n"
                                for e, last in held)
        if payload[:8] == b'{"error"':
            scan.error = True
            return self._release_before_end(scan, event)
        if not _role_only(payload, obj):
            scan.tokens += 1
        if not self.keep_last:  # usage is stripped, and nothing over MAX_HELD_BYTES held yet
            last = _maybe_last(payload, obj)
            if last or self.held:  # from a choice's last chunk on, until the usage chunk
                return self._hold(event, last)
        return None

    def _hold(self, event: bytes, last: bool) -> bytes:
        self.held.append((event, last))
        self.held_bytes += len(event) + 2
        if self.held_bytes > MAX_HELD_BYTES:
            self.keep_last = True  # stop holding: this stream's last chunks go as they come
            return self.release()
        return b""

    def _release_before_end(self, scan: Scan, event: bytes | None = None) -> bytes | None:
        if not self.held:
            return None if event is not None else b""
        return self.release() + (event + b"\n\n" if event is not None else b"")


def _object(payload: bytes) -> dict[str, Any] | None:
    try:
        obj = jsontext.loads(payload)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _role_only(payload: bytes, obj: dict[str, Any] | None) -> bool:
    """The first chat chunk, a role and no content: not a token."""
    if _ROLE_ONLY in payload and payload.count(b'"index":') == 1:
        return True
    if b'"role"' not in payload:
        return False
    obj = obj if obj is not None else _object(payload)
    choices = obj.get("choices") if obj is not None else None
    if not isinstance(choices, list) or not choices:
        return False
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict) or "role" not in delta:
            return False
        if any(v not in ("", None) for k, v in delta.items() if k != "role"):
            return False
    return True


def _maybe_last(payload: bytes, obj: dict[str, Any] | None) -> bool:
    """Whether this chunk ends a choice (a non-null ``finish_reason``); parsed only when its
    bytes do not already say null."""
    if b"finish_reason" not in payload or _NULL_FINISH[0] in payload or (
            _NULL_FINISH[1] in payload):
        return False
    obj = obj if obj is not None else _object(payload)
    choices = obj.get("choices") if obj is not None else None
    return isinstance(choices, list) and any(
        isinstance(c, dict) and c.get("finish_reason") is not None for c in choices)


def _with_fields(event: bytes, usage_chunk: dict[str, Any]) -> bytes:
    """``event`` (a choice's last chunk) with the fields the client would have seen on it,
    taken from the usage chunk: spliced before its closing brace, the rest byte for byte."""
    extra = b"".join(
        b',"%s":%s' % (name.encode(), json.dumps(usage_chunk[name]).encode())
        for name in TERMINAL_FIELDS
        if name in usage_chunk and b'"%s"' % name.encode() not in event)
    return event[:-1] + extra + b"}\n\n"


def usage_counts(usage: Any) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) of a ``usage`` object, None if it is not one: a
    negative count is an engine's bug, not tokens, and is not counted (a counter only grows)."""
    try:
        counts = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    except (ValueError, AttributeError, TypeError, OverflowError):
        return None
    return counts if min(counts) >= 0 else None


def usage_of_object(obj: Any) -> tuple[int, int] | None:
    """Token counts of a parsed non-streamed answer's ``usage``, None when absent."""
    usage = obj.get("usage") if isinstance(obj, dict) else None
    return usage_counts(usage) if isinstance(usage, dict) else None


_DECODER = json.JSONDecoder()


def usage_of_tail(tail: bytes) -> tuple[int, int] | None:
    """Token counts from the last ``"usage": {...}`` in the end of a JSON answer too large to
    parse whole (vLLM puts usage last); None when the tail holds no readable one."""
    at = tail.rfind(b'"usage"')
    if at < 0:
        return None
    text = tail[at + len(b'"usage"'):].decode("utf-8", "replace").lstrip()
    if not text.startswith(":"):
        return None
    try:
        usage, _ = _DECODER.raw_decode(text[1:].lstrip())
    except (ValueError, RecursionError):
        return None
    return usage_counts(usage) if isinstance(usage, dict) else None


def parse_usage(payload: bytes) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) of a JSON object's ``usage``, None without one."""
    obj = _object(payload)
    usage = obj.get("usage") if obj is not None else None
    return usage_counts(usage) if isinstance(usage, dict) else None


def usage_of_body(body: bytes) -> tuple[int, int] | None:
    """Token counts of a non-streamed JSON answer's ``usage``, None when absent."""
    return parse_usage(body) if b'"usage"' in body else None


def usage_options(options: Any) -> dict[str, Any]:
    """The ``stream_options`` to send for a streamed request whose client did not ask for
    usage: the client's, with usage asked for (the proxy strips it again).

    ``continuous_usage_stats`` is dropped: vLLM ignores it without ``include_usage``, so the
    client would have had no usage in its chunks; asked for on its behalf, it would put usage
    in every one of them."""
    kept = {k: v for k, v in options.items() if k != "continuous_usage_stats"} if isinstance(
        options, dict) else {}
    return {**kept, "include_usage": True}
