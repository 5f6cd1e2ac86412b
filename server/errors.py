"""Errors of the proxy, each rendering itself as an OpenAI-format error body.

    ProxyError                       base: status, type, code, retry_after
    ├── BadRequest (400)             malformed JSON, wrong types, invalid UTF-8, nesting too deep
    ├── Unauthorized (401)           missing or wrong API key
    ├── Forbidden (403)              an admin route without the admin key
    ├── NotFound (404)               no such route
    ├── RequestTimeout (408)         the client sent its body too slowly
    ├── BodyTooLarge (413)           body over --max-body-bytes
    ├── TooManyRequests (429)        in-flight limit and queue full (Retry-After)
    ├── UpstreamUnavailable (503)    no engine answers: down or restarting (Retry-After)
    │   ├── EngineGroupNodeDown      a node of a multi-node engine group is missing
    │   └── EngineGroupRestarting    the group is being restarted (server.enginestatus)
    ├── UpstreamTimeout (504)        the engine did not answer in time
    └── UpstreamBadResponse (502)    the engine answered something that is not HTTP/JSON/SSE
ConfigError                          bad command line or key file; the message says the fix
"""

from __future__ import annotations

import json
from typing import Any


class ConfigError(Exception):
    """A configuration the proxy cannot start with; the message tells the user what to do."""


class ProxyError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None
    retry_after: int | None = None
    # The request body was not read to its end: the connection cannot carry another request.
    close_connection = False

    def __init__(self, message: str, *, param: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if retry_after is not None:
            self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code, self.param)

    def headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"connection", b"close")] if self.close_connection else []
        if self.retry_after is not None:
            headers.append((b"retry-after", str(self.retry_after).encode()))
        return headers


class BadRequest(ProxyError):
    status, type, code = 400, "invalid_request_error", "invalid_request"


class Unauthorized(ProxyError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class Forbidden(ProxyError):
    status, type, code = 403, "permission_error", "admin_route"


class NotFound(ProxyError):
    status, type, code = 404, "invalid_request_error", "not_found"


class MethodNotAllowed(ProxyError):
    """A method no route serves at that path; ``allow`` (the routes' methods) goes out as the
    ``Allow`` header, which RFC 9110 15.5.6 requires on a 405, and in the message."""

    status, type, code = 405, "invalid_request_error", "method_not_allowed"

    def __init__(self, method: str, path: str, allow: str) -> None:
        super().__init__(f"{method} is not served on {path}: send one of {allow}")
        self.allow = allow

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [*super().headers(), (b"allow", self.allow.encode("latin-1"))]


class RequestTimeout(ProxyError):
    status, type, code = 408, "invalid_request_error", "request_timeout"
    close_connection = True


class BodyTooLarge(ProxyError):
    status, type, code = 413, "invalid_request_error", "request_too_large"
    close_connection = True


class TooManyRequests(ProxyError):
    status, type, code, retry_after = 429, "rate_limit_error", "rate_limit_exceeded", 1


class UpstreamUnavailable(ProxyError):
    status, type, code, retry_after = 503, "server_error", "engine_unavailable", 5


class EngineGroupNodeDown(UpstreamUnavailable):
    code = "engine_group_node_down"


class EngineGroupRestarting(UpstreamUnavailable):
    code = "engine_group_restarting"


class UpstreamTimeout(ProxyError):
    status, type, code = 504, "server_error", "engine_timeout"


class UpstreamBadResponse(ProxyError):
    status, type, code = 502, "server_error", "bad_engine_response"


# What a request still running past --drain-timeout is told (a 503, or its stream's error event)
SHUTDOWN_MESSAGE = "the proxy is shutting down; retry the request"


def error_body(message: str, err_type: str, code: str | None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def stream_error_event(message: str, code: str) -> bytes:
    """The SSE events that end a broken stream: an error object, then ``[DONE]``, like vLLM."""
    payload = json.dumps(error_body(message, "server_error", code))
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()
