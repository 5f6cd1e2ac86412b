"""The API dialects the relay speaks: how a stream is framed and checked, how errors look (pure).

The relay (server.relay) asks the request's ``Dialect`` for everything that differs between
OpenAI's chat/completions, OpenAI's Responses and Anthropic's Messages, so a dialect is added
here without touching the relay's hot loop:

- ``stream_rules()``: one ``StreamRules`` per relayed event stream; it is fed every chunk the
  engine sends, says what to forward, how many tokens passed, the usage, whether the stream is
  over, and at the engine's end of the stream whether it was whole (``missing_end``);
- ``stream_error()``: the events that end a stream the proxy must break off;
- ``error_body()``: the proxy's own error answers in the route's shape.

Terminal events are looked for as ``event:`` lines at the start of a line (SSE allows CR, LF
or CRLF line ends), so a model's text, JSON-escaped inside ``data:``, never looks like one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from server import anthropic
from server.errors import ProxyError, stream_error_event
from server.sse import Scan, SseInspector

_LINE_ENDS = b"\r\n"


class TerminalEvents:
    """Whether an ``event: NAME`` line with NAME one of ``names`` has passed, across reads."""

    __slots__ = ("names", "seen", "span", "tail")

    def __init__(self, names: Iterable[bytes]) -> None:
        self.names = frozenset(names)
        self.seen = False
        # what a marker line split between two reads can need from the previous one
        self.span = max(map(len, self.names)) + len(b"\nevent: \n")
        self.tail = b"\n"  # the stream's first line starts a line too

    def feed(self, data: bytes) -> bool:
        if self.seen:
            return True
        window = self.tail + data
        pos = window.find(b"event:", 1)
        while pos > 0:
            if window[pos - 1] in _LINE_ENDS and self._named(window, pos + 6):
                self.seen = True
                return True
            pos = window.find(b"event:", pos + 1)
        self.tail = window[-self.span:]
        return False

    def _named(self, window: bytes, start: int) -> bool:
        if window[start:start + 1] == b" ":
            start += 1
        ends = [i for i in (window.find(b"\n", start), window.find(b"\r", start)) if i >= 0]
        return bool(ends) and window[start:min(ends)] in self.names


class StreamRules(Protocol):
    """One relayed event stream's reading, made by ``Dialect.stream_rules``."""

    @property
    def done(self) -> bool:
        """The stream's last event has passed: what follows is not the client's."""

    def feed(self, data: bytes) -> Scan:
        """What ``data`` (the next bytes from the engine) carries, and what to forward."""

    def plain_token(self, data: bytes) -> bool:
        """``data`` is exactly one token event, forwarded unchanged and needing no ``feed``."""

    def release(self) -> bytes:
        """Events held back (usage stripping) that the client gets when the stream breaks."""

    def missing_end(self) -> str | None:
        """At the engine's clean end of the stream: None when whole, else what is missing."""


class OpenAIEvents(SseInspector):
    """chat/completions and completions: ``data:`` events to ``[DONE]``, usage stripped when
    the client did not ask for it (server.sse). The inspector itself, not a wrapper: the relay
    calls ``plain_token`` per token event, and a wrapper's extra call showed in its profile."""

    def missing_end(self) -> str | None:
        return None if self.done else "[DONE]"


class PassThrough:
    """Relayed as it is, checked only for a terminal event (None: not checked)."""

    __slots__ = ("terminal", "what")

    def __init__(self, terminal: Iterable[bytes] | None, what: str) -> None:
        self.terminal = TerminalEvents(terminal) if terminal is not None else None
        self.what = what

    @property
    def done(self) -> bool:
        return False  # the engine's end of the stream is its end

    def feed(self, data: bytes) -> Scan:
        if self.terminal is not None:
            self.terminal.feed(data)
        return Scan(data)

    def plain_token(self, data: bytes) -> bool:
        return False

    def release(self) -> bytes:
        return b""

    def missing_end(self) -> str | None:
        if self.terminal is None or self.terminal.seen:
            return None
        return self.what


class Dialect:
    """OpenAI's shapes; subclasses change what differs."""

    name = "openai"

    def stream_rules(self, inspect: bool, strip_usage: bool) -> StreamRules:
        return OpenAIEvents(strip_usage) if inspect else PassThrough(None, "")

    def stream_error(self, message: str, code: str) -> bytes:
        return stream_error_event(message, code)

    def error_body(self, exc: ProxyError, request_id: str) -> dict[str, Any]:
        return exc.body()


class AnthropicMessages(Dialect):
    """``/v1/messages``: must end in ``message_stop`` (the Anthropic SDK takes a stream cut
    short without an error event for a whole, truncated, message); errors in its shape."""

    name = "anthropic"

    def stream_rules(self, inspect: bool, strip_usage: bool) -> StreamRules:
        return PassThrough((b"message_stop",), "message_stop")

    def stream_error(self, message: str, code: str) -> bytes:
        return anthropic.stream_error_event(message, timeout=code == "timeout")

    def error_body(self, exc: ProxyError, request_id: str) -> dict[str, Any]:
        return anthropic.error_body(exc.status, exc.message, request_id)


class OpenAIResponses(Dialect):
    """``/v1/responses``: must end in a terminal event (the openai SDK takes a stream cut short
    without one for a finished, truncated, response)."""

    name = "responses"
    TERMINAL = (b"response.completed", b"response.incomplete", b"response.failed", b"error")

    def stream_rules(self, inspect: bool, strip_usage: bool) -> StreamRules:
        return PassThrough(self.TERMINAL, "response.completed")


OPENAI, ANTHROPIC, RESPONSES = Dialect(), AnthropicMessages(), OpenAIResponses()


def dialect_for(target: str) -> Dialect:
    """The dialect of a request target (path and query)."""
    if anthropic.is_anthropic(target):
        return ANTHROPIC
    path = target.split("?", 1)[0]
    if path == "/v1/responses" or path.startswith("/v1/responses/"):
        return RESPONSES
    return OPENAI
