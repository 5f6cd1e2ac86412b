"""The Anthropic Messages API's error shapes, for the proxy's own errors on its routes (pure).

vLLM serves ``/v1/messages`` (and ``/v1/messages/count_tokens``) in Anthropic's format; the
proxy relays them. What the proxy itself answers there (a wrong key, a full queue, an engine
that is down or breaks off its stream) must be in that format too, or Anthropic clients
misread it: the Anthropic SDK ignores an SSE event without an ``event:`` name, so an OpenAI
style ``data: {"error": ...}`` at the end of a broken stream reads as a truncated message with
no error. Here: ``{"type": "error", "error": {"type", "message"}, "request_id"}`` with the
status, and ``event: error`` carrying the same object in a stream.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "/v1/messages"
# Anthropic's error types by HTTP status (its API reference); other 4xx are
# invalid_request_error, other 5xx api_error.
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    500: "api_error", 502: "api_error", 503: "overloaded_error", 504: "timeout_error",
    529: "overloaded_error",
}
KEY_HINT = ("missing or wrong API key: send it as 'x-api-key: <key>' (or 'Authorization: "
            "Bearer <key>'); the key given to launcher serve or python -m server")


def is_anthropic(path: str) -> bool:
    """Whether ``path`` (a request target, query and all) is one of the Anthropic routes."""
    return path.startswith(PREFIX) and path[len(PREFIX):len(PREFIX) + 1] in ("", "/", "?")


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str, request_id: str | None = None) -> dict[str, Any]:
    if status == 401 and "x-api-key" not in message:
        message = KEY_HINT  # what an Anthropic client sends its key as
    return {"type": "error", "error": {"type": error_type(status), "message": message},
            "request_id": request_id}


def stream_error_event(message: str, timeout: bool = False) -> bytes:
    """The event that ends a broken Anthropic stream (no [DONE]: Anthropic streams have none).
    Its type: timeout_error when the engine went silent, else api_error."""
    body = {"type": "error", "error": {"type": "timeout_error" if timeout else "api_error",
                                       "message": message}}
    return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
