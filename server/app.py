"""The FastAPI surface: routing, request checks, errors, OpenAPI; streaming goes to server.relay.

Routes: POST /v1/chat/completions and /v1/completions (checked, usage asked for, relayed with
SSE inspection), GET /v1/models and every other path (relayed unchanged), GET /health (the proxy
lives), GET /ready (an engine answers), GET /metrics. /v1/* and the relayed routes need an API
key when keys are configured; /health, /ready and /metrics stay open unless --protect-metrics.
vLLM's admin and development routes (ADMIN_PATHS) are refused unless an admin key is configured
and sent. A large request body is parsed and checked in a thread, with its object fields
counted as they are parsed, so that no request holds the event loop for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import posixpath
import re
import secrets
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)
from pydantic import BaseModel, ValidationError
from pydantic_core import from_json
from starlette.exceptions import HTTPException as StarletteHTTPException

from server import anthropic, guard
from server.admission import Admission
from server.asgi import Message, Receive, Scope, Send, body_buffered, disconnect_hook
from server.config import ProxyConfig
from server.enginestats import EngineCacheStats
from server.errors import (
    SHUTDOWN_MESSAGE,
    BadRequest,
    BodyTooLarge,
    Forbidden,
    MethodNotAllowed,
    NotFound,
    ProxyError,
    RequestTimeout,
    Unauthorized,
    UpstreamUnavailable,
)
from server.health import HealthChecker, model_entries
from server.metrics import (
    GpuCollector,
    GpuSampler,
    MetricList,
    ProxyMetrics,
    merge_worker_metrics,
    route_label,
)
from server.relay import Call, Relay, send_error
from server.router import Router, affinity_key
from server.schemas import ChatCompletionRequest, CompletionRequest, message_list
from server.sse import usage_options
from server.upstream import UpstreamError
from server.workers import PeerMetrics, Seat
from topocommon import jsontext

log = logging.getLogger("toposerve.access")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# Not forwarded: hop-by-hop headers, the proxy's own credentials, and what the relay sets.
_DROP_HEADERS = frozenset({
    "host", "connection", "keep-alive", "proxy-authorization", "proxy-connection", "te",
    "trailer", "transfer-encoding", "upgrade", "content-length", "authorization", "x-api-key",
    "x-request-id", "expect", "cookie",
})
# HEAD is relayed as HEAD: the engine's client knows its answer has no body (server.upstream)
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
GENERATION_SCHEMAS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}
# vLLM's admin and development routes (vllm/entrypoints: serve/, rl/, scale_out/; v0.26):
# they sleep or reconfigure the engine, load code paths and weights, or tell its internals.
# Matched on the decoded path, lower-cased, slashes collapsed, dot segments resolved.
ADMIN_PATHS = frozenset({
    "/collective_rpc", "/sleep", "/wake_up", "/is_sleeping", "/reset_prefix_cache",
    "/reset_mm_cache", "/reset_encoder_cache", "/release_kv_cache_memory",
    "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/start_profile", "/stop_profile",
    "/scale_elastic_ep", "/is_scaling_elastic_ep", "/pause", "/resume", "/is_paused",
    "/update_weights", "/init_weight_transfer_engine", "/start_weight_update",
    "/finish_weight_update", "/start_draft_weight_update", "/update_weight_version",
    "/shutdown_weight_transfer_engine", "/weight_checker", "/weight_info", "/get_world_size",
    "/abort_requests", "/server_info", "/kv_event_sources",
})
ADMIN_PREFIXES = ("/fault_tolerance/",)
# Bodies from this size on are parsed and checked in a thread (json.loads with a Python hook
# per object, so the GIL is handed back to the event loop as it goes); smaller ones inline,
# where their size bounds the work (a few ms at most).
# A scrape waits this long at most for the engines' prefix-cache counters (server/enginestats).
ENGINE_METRICS_TIMEOUT_S = 1.0
# vLLM's /metrics is tens of KiB (a few hundred per LoRA or model label); a broken engine's
# endless one is cut here instead of at --max-response-bytes (64 MiB) on every scrape.
ENGINE_METRICS_MAX_BYTES = 4 << 20
THREAD_BODY_BYTES = 64 * 1024
VALIDATE_SLICE = 1024  # messages validated per pydantic call in the thread (GIL released between)


class Proxy:
    """Everything one proxy instance holds; the app's routes are thin calls into it."""

    def __init__(self, cfg: ProxyConfig, registry: CollectorRegistry | None = None,
                 seat: Seat | None = None) -> None:
        self.cfg = cfg
        self.registry = registry or CollectorRegistry()
        # With --workers: this worker's siblings, whose metrics a scrape sums (server.workers)
        self.peers = (PeerMetrics(seat, lambda: generate_latest(self.registry))
                      if seat is not None and seat.count > 1 else None)
        # NVML is read by one worker: the GPUs are the same for all (WORKER_SHARED_PREFIXES)
        self.samples_gpus = seat is None or seat.index == 0
        self.metrics = ProxyMetrics(self.registry, cfg.plan_info)
        self.gpu = GpuSampler(cfg.gpu_interval_s)
        self.registry.register(GpuCollector(self.gpu.latest))  # a scrape never waits for NVML
        self.router = Router(cfg.upstreams, cfg.affinity_slack)
        self.admission = Admission(cfg.max_in_flight, cfg.max_queue, cfg.queue_timeout_s)
        self.relay = Relay(cfg, self.router, self.metrics, self.admission)
        for pool in self.relay.pools.values():
            pool.max_response_bytes = cfg.max_response_bytes
        self.metrics.queued.set_function(lambda: self.admission.queued)  # read at scrape time
        self.health = HealthChecker(cfg, self.router, self.metrics, self.relay.pools)
        self.engine_cache = EngineCacheStats()
        self.registry.register(self.engine_cache)
        self._keys = [k.encode() for k in cfg.api_keys]
        self._admin_keys = [k.encode() for k in cfg.admin_api_keys]
        self.guard = guard.policy(cfg.host, cfg.port, bool(cfg.api_keys), cfg.allowed_hosts,
                                  cfg.allowed_origins, cfg.allow_internal_media,
                                  loopback=cfg.loopback_only, own_names=[socket.gethostname()])

    # -- checks ------------------------------------------------------------------------------

    def refused_by_http_layer(self, status: int, target: str) -> None:
        """A request the HTTP layer refused before any route ran (server.front's Guards):
        counted and logged as the routes' answers are; it has no request id nor, for a head
        refused before its method was read, a method ("-")."""
        route = route_label(target.partition("?")[0])
        self.metrics.requests.labels("unknown", route, str(status)).inc()
        log.info("- - %s %d", route, status)

    def authorize(self, headers: Mapping[str, str]) -> None:
        """Constant-time check of ``Authorization: Bearer K`` or ``x-api-key: K``."""
        if self._keys and not key_matches(headers, self._keys):
            raise Unauthorized("missing or wrong API key: send it as 'Authorization: Bearer "
                               "<key>' (the key given to launcher serve or python -m server)")

    def authorize_admin(self, path: str, headers: Mapping[str, str]) -> None:
        if not self._admin_keys:
            raise Forbidden(f"{path} is one of vLLM's admin routes, which this proxy refuses: "
                            "start it with --admin-api-key (or --admin-api-key-file) and send "
                            "that key to use them")
        if not key_matches(headers, self._admin_keys):
            raise Forbidden(f"{path} is one of vLLM's admin routes: send the admin key (the "
                            "one given to --admin-api-key), not a user key")

    def check_body(self, schema: type[BaseModel], body: bytes) -> dict[str, Any]:
        """Parsed and checked (inline: ``body`` is small)."""
        obj = parse_object(body)
        check_bounds(obj, self.cfg.max_messages)
        check(schema, obj)
        self.check_media(body, obj)
        return obj

    def check_media(self, body: bytes, obj: Any) -> None:
        """Media URLs the engine would fetch from inside are refused (server.guard)."""
        if not self.guard.allow_internal_media and guard.may_name_media(body):
            refusal = guard.media_refusal(obj)
            if refusal is not None:
                raise refusal

    def check_large_body(self, schema: type[BaseModel], body: bytes) -> dict[str, Any]:
        """Parsed and checked in a worker thread: the fields are counted while parsing (past
        the limit the parse stops), the message count before validation, and the messages
        are validated in slices, so the event loop gets the GIL back throughout."""
        obj = parse_object(body, self.cfg.max_json_fields)
        check_bounds(obj, self.cfg.max_messages)
        messages = obj.get("messages")
        if schema is ChatCompletionRequest and isinstance(messages, list) and messages:
            check(schema, {**obj, "messages": messages[:1]})
            for start in range(0, len(messages), VALIDATE_SLICE):
                check_messages(messages[start:start + VALIDATE_SLICE], start)
        else:
            check(schema, obj)
        self.check_media(body, obj)
        return obj

    async def read_body(self, receive: Receive, headers: Mapping[str, str],
                        hook: dict[str, Any] | None = None) -> bytes:
        limit = self.cfg.max_body_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(f"request body of {declared} bytes is over the {limit}-byte limit "
                               "(raise it with --max-body-bytes)")
        chunks, size = [], 0
        # A body uvicorn already holds whole (the usual case) comes in one receive() that does
        # not wait: no timer to set up and cancel for it.
        whole = body_buffered(hook)
        try:
            async with (contextlib.nullcontext() if whole
                        else asyncio.timeout(self.cfg.body_timeout_s)):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise ClientGone
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise BodyTooLarge(f"request body over the {limit}-byte limit (raise "
                                           "it with --max-body-bytes)")
                    chunks.append(chunk)
                    if not message.get("more_body"):
                        return b"".join(chunks)
        except TimeoutError:
            raise RequestTimeout(f"the request body took over {self.cfg.body_timeout_s:g} s to "
                                 "arrive; send it at once") from None

    # -- the routes ----------------------------------------------------------------------------

    async def generation(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v1/chat/completions and /v1/completions, in raw ASGI (the hot path)."""
        path = scope["path"]
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        rid = pick_request_id(headers.get("x-request-id", ""))
        try:
            refusal = guard.check_head(self.guard, scope["headers"], scope.get("client"),
                                       scope.get("server"))
            if refusal is not None:
                raise refusal
            self.authorize(headers)
            body = await self.read_body(receive, headers, disconnect_hook(scope))
            large = len(body) >= THREAD_BODY_BYTES
            if large:
                obj = await asyncio.to_thread(self.check_large_body, GENERATION_SCHEMAS[path],
                                              body)
            else:
                obj = self.check_body(GENERATION_SCHEMAS[path], body)
        except ProxyError as exc:
            self.metrics.requests.labels("unknown", path, str(exc.status)).inc()
            log.info("%s POST %s %d", rid, path, exc.status)
            await send_error(send, exc, rid)
            return
        except ClientGone:
            return
        except asyncio.CancelledError:  # by the server, past --drain-timeout: body still coming
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # for the bounded answer; the request ends with it
            cut = UpstreamUnavailable(SHUTDOWN_MESSAGE)
            self.metrics.requests.labels("unknown", path, str(cut.status)).inc()
            log.info("%s POST %s %d", rid, path, cut.status)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await send_error(send, cut, rid)
            return
        strip = False
        if obj.get("stream"):
            options = obj.get("stream_options") or {}
            if not options.get("include_usage"):
                # Usage feeds the token counters; the client did not ask, so it is dropped again.
                spliced = with_usage_option(body) if "stream_options" not in obj else None
                if spliced is None:
                    obj["stream_options"] = usage_options(options)
                    spliced = (await asyncio.to_thread(_encode, obj) if large
                               else _encode(obj))
                body = spliced
                strip = True
        query = scope.get("query_string", b"").decode("latin-1")
        call = Call(request_id=rid, method="POST", target=path + (f"?{query}" if query else ""),
                    route=path, model=self.metrics.model_label(obj.get("model")),
                    headers=upstream_headers(headers.items(), rid), body=body, inspect=True,
                    strip_usage=strip,
                    affinity=affinity_key(obj) if len(self.router.upstreams) > 1 else None,
                    wanted_model=_model_of(obj),
                    disconnect_hook=disconnect_hook(scope))
        await self.relay.handle(call, receive, send)

    async def passthrough(self, request: Request) -> Response:
        rid = request_id(request)
        if is_admin_path(request.url.path):
            self.authorize_admin(request.url.path, request.headers)
        else:
            self.authorize(request.headers)
        try:
            body = await self.read_body(request.receive, request.headers,
                                        disconnect_hook(request.scope))
        except ClientGone:
            return Response(status_code=499)
        media = (request.method == "POST" and not self.guard.allow_internal_media
                 and guard.may_name_media(body))
        # /v1/messages, /v1/responses, /v1/embeddings... name a model too
        want_model = request.method == "POST" and bool(body) and self.router.serves_several_models
        wanted = None
        if media or want_model:
            refusal, wanted = (await asyncio.to_thread(_inspect_body, body, media)
                               if len(body) >= THREAD_BODY_BYTES else _inspect_body(body, media))
            if refusal is not None:
                raise refusal
        call = Call(request_id=rid, method=request.method, target=_target(request),
                    route=route_label(request.url.path), model="unknown",
                    headers=upstream_headers(request.headers.items(), rid), body=body,
                    wanted_model=wanted, disconnect_hook=disconnect_hook(request.scope))
        return RelayResponse(lambda _s, receive, send: self.relay.handle(call, receive, send))

    async def all_models(self, request: Request) -> Response | None:
        """Every model of the replicas that are up, when they serve different ones (one
        replica's /v1/models would name only its own); None when no list could be read."""
        self.authorize(request.headers)
        seen: dict[str, Any] = {}
        for up in self.router.upstreams:
            if up.up:
                entries = await model_entries(self.relay.pools[up.url], self.cfg.connect_timeout_s)
                for entry in entries or ():
                    seen.setdefault(entry["id"], entry)
        if not seen:
            return None
        return JSONResponse({"object": "list", "data": list(seen.values())})

    async def ready(self, request: Request) -> Response:
        if self.cfg.protect_metrics:
            self.authorize(request.headers)
        await self.health.check_all(timeout_s=min(2.0, self.cfg.connect_timeout_s))
        states = [{"url": u.url, "up": u.up, "outstanding": u.outstanding}
                  for u in self.router.upstreams]
        if self.router.any_up:
            return JSONResponse({"ready": True, "upstreams": states})
        exc = self.relay.engine_status.error() or UpstreamUnavailable("no engine is ready yet")
        return JSONResponse({"ready": False, "upstreams": states, "why": exc.message,
                             "code": exc.code}, status_code=503,
                            headers={"retry-after": str(exc.retry_after)})

    async def metrics_text(self, request: Request) -> Response:
        if self.cfg.protect_metrics:
            self.authorize(request.headers)
        await self.engine_cache.refresh(
            [u.url for u in self.router.upstreams if u.up], self._engine_metrics)
        own = generate_latest(self.registry)
        if self.peers is None:
            return Response(own, media_type=CONTENT_TYPE_LATEST)
        texts = [own.decode(), *await self.peers.read_peers()]
        merged = merge_worker_metrics(texts, self.peers.seat.count)
        return Response(generate_latest(MetricList(merged)),  # type: ignore[arg-type]
                        media_type=CONTENT_TYPE_LATEST)

    async def _engine_metrics(self, url: str) -> str | None:
        """One replica's /metrics text, or None when it does not answer in time."""
        try:
            async with asyncio.timeout(ENGINE_METRICS_TIMEOUT_S):
                status, body = await self.relay.pools[url].get("/metrics", ENGINE_METRICS_MAX_BYTES)
        except (TimeoutError, UpstreamError, OSError):
            return None
        return body.decode("utf-8", "replace") if status == 200 else None


class ClientGone(Exception):
    """The client disconnected before its request body was complete."""


def upstream_headers(items: Iterable[tuple[str, str]], rid: str) -> list[tuple[str, str]]:
    headers = [(k, v) for k, v in items if k not in _DROP_HEADERS]
    headers.append(("x-request-id", rid))
    return headers


class RelayResponse(Response):
    """A response that is a raw ASGI callable: what FastAPI hands over to the relay."""

    def __init__(self, asgi: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.asgi = asgi
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # type: ignore[override]
        await self.asgi(scope, receive, send)


class ProxyApp:
    """The ASGI app: the two generation routes go straight to the lean path, the rest (and
    the OpenAPI schema, which documents all of them) to FastAPI."""

    def __init__(self, proxy: Proxy, fastapi: FastAPI) -> None:
        self.proxy = proxy
        self.fastapi = fastapi

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = (guard.cors_origin(self.proxy.guard, scope["headers"])
                  if scope["type"] == "http" else None)
        if origin is not None:
            if scope["method"] == "OPTIONS" and await self.preflight(scope, send, origin):
                return
            send = self.with_cors(scope, send, origin)
        if (scope["type"] == "http" and scope["method"] == "POST"
                and scope["path"] in GENERATION_SCHEMAS):
            await self.proxy.generation(scope, receive, send)  # checks the head itself
            return
        refusal = (guard.check_head(self.proxy.guard, scope["headers"], scope.get("client"),
                                    scope.get("server"))
                   if scope["type"] == "http" else None)
        if refusal is not None:
            await self.refuse(scope, send, refusal)
            return
        try:
            await self.fastapi(scope, receive, send)
        except asyncio.CancelledError:
            await self.cut_at_shutdown(scope, send)

    async def cut_at_shutdown(self, scope: Scope, send: Send) -> None:
        """uvicorn cancels the requests still running past its graceful-shutdown timeout
        (--drain-timeout). The relay tells its own client (a 503 or the stream's error event);
        one cancelled elsewhere (its body still arriving, /ready or /metrics asking an engine)
        gets the same 503 here. Not re-raised: uvicorn would log each as an 'Exception in ASGI
        application' with a traceback and answer one not yet answered with a text/plain 500."""
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        with contextlib.suppress(Exception):  # an answer already begun: the relay's, ended
            async with asyncio.timeout(1.0):
                await self.refuse(scope, send, UpstreamUnavailable(SHUTDOWN_MESSAGE))

    def lean_handler(self) -> Callable[[Scope, Receive, Send], Coroutine[Any, Any, None]]:
        """What the lean front (server.front) calls for the generation routes: the proxy's own
        handler, or with CORS first where --allowed-origins names any (bound at start-up, so
        the hot path of a proxy without them pays nothing)."""
        if not self.proxy.guard.allowed_origins:
            return self.proxy.generation
        return self.__call__

    async def preflight(self, scope: Scope, send: Send, origin: bytes) -> bool:
        """A CORS preflight from an allowed origin answered 204 (the Host check still applies;
        no key is asked: browsers send none on a preflight). False: not a preflight."""
        headers = guard.preflight(origin, scope["headers"])
        if headers is None or guard.check_head(self.proxy.guard, scope["headers"],
                                               scope.get("client"), scope.get("server")):
            return False
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})
        return True

    @staticmethod
    def with_cors(scope: Scope, send: Send, origin: bytes) -> Send:
        """``send`` adding the CORS headers to the response's start, and the same headers left
        in the disconnect hook for the relay's downstream (server.asgi), which writes through
        the protocol's own send. Added once, whichever path the response takes."""
        extra = guard.cors_headers(origin)
        hook = disconnect_hook(scope)
        if hook is not None:
            hook["response_headers"] = extra

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in message.get("headers", ())}
                if b"access-control-allow-origin" not in names:
                    message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        return send_with_cors

    async def refuse(self, scope: Scope, send: Send, exc: ProxyError) -> None:
        """A request the local-serving protections refuse, answered before any route runs,
        in the route's dialect (Anthropic's on /v1/messages)."""
        path = scope["path"]
        rid = pick_request_id(dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1"))
        route = route_label(path)
        self.proxy.metrics.requests.labels("unknown", route, str(exc.status)).inc()
        log.info("%s %s %s %d", rid, scope["method"], route, exc.status)
        body = json.dumps(anthropic.error_body(exc.status, exc.message, rid)
                          if anthropic.is_anthropic(path) else exc.body()).encode()
        await send({"type": "http.response.start", "status": exc.status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
            (b"x-request-id", rid.encode()), *exc.headers()]})
        await send({"type": "http.response.body", "body": body})

    def openapi(self) -> dict[str, Any]:
        return self.fastapi.openapi()


# Fresh request ids: a random prefix per process and a counter (32 hex digits in all). Unique
# is all they need to be; drawing 16 random bytes per request cost a getrandom() system call.
_RID_PREFIX = secrets.token_hex(8)
_rid_counter = itertools.count()


def pick_request_id(given: str) -> str:
    """The client's X-Request-Id when it is a safe token, else a fresh one (32 hex digits)."""
    if given and _REQUEST_ID.fullmatch(given):
        return given
    return f"{_RID_PREFIX}{next(_rid_counter) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def request_id(request: Request) -> str:
    rid = pick_request_id(request.headers.get("x-request-id", ""))
    request.state.request_id = rid
    return rid


def _json_or_none(body: bytes) -> Any:
    try:
        return jsontext.loads(body)
    except ValueError:  # the engine answers a broken body in its own words
        return None


def _inspect_body(body: bytes, media: bool) -> tuple[ProxyError | None, str | None]:
    """A relayed body's media refusal (when ``media``) and the model it names, from one parse.
    Called in a worker thread for a large body: the parse, the walk over every object and the
    freeing of them all happen there, never on the event loop (an 8 MB body of a million small
    objects held the loop for about a second when only the parse was in the thread)."""
    try:  # through a Python hook per object, as parse_object's counted parse: json.loads
        # gives the GIL up only between calls into Python, so without one a body of many
        # small objects held the loop for the whole parse
        obj = json.loads(body, object_pairs_hook=_python_dict)
    except ValueError:  # the engine's json.loads refuses it too, and answers in its own words
        obj = None
    except RecursionError:
        # Not broken JSON: deeper than this interpreter's parser goes, and an engine on
        # another Python may read deeper (3.11 stops under 1,000 levels; from 3.12 C code has
        # its own, higher limit): relayed unread, its media URLs went to the engine unchecked.
        return BadRequest(_TOO_DEEP), None
    return (guard.media_refusal(obj) if media else None), _model_of(obj)


def _python_dict(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``dict`` as Python code: the interpreter hands the GIL over only while running bytecode
    (a C hook such as ``dict`` itself never lets the event loop in)."""
    return dict(pairs)


def _model_of(obj: Any) -> str | None:
    model = obj.get("model") if isinstance(obj, dict) else None
    return model if isinstance(model, str) else None


def _target(request: Request) -> str:
    """The path as the client sent it (still percent-encoded, so that any byte it encodes can
    be written in the request line), and the query."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    query = request.scope.get("query_string", b"")
    return (raw + (b"?" + query if query else b"")).decode("latin-1")


def is_admin_path(path: str) -> bool:
    """``path`` (decoded, as vLLM routes it) is one of ADMIN_PATHS, however it is spelled."""
    norm = posixpath.normpath(re.sub(r"/+", "/", path)).lower().rstrip("/") or "/"
    return norm in ADMIN_PATHS or norm.startswith(ADMIN_PREFIXES) or (
        norm + "/").startswith(ADMIN_PREFIXES)


def key_matches(headers: Mapping[str, str], keys: list[bytes]) -> bool:
    """The key sent (``Authorization: Bearer K`` or ``x-api-key: K``), as bytes, is one of
    ``keys`` (UTF-8). Both servers decode header bytes as latin-1, so encoding back to latin-1
    gives what the client sent: a key with non-ASCII characters matches. Every key is
    compared, in constant time: the time does not say which matched."""
    given = headers.get("authorization", "")
    token = given[7:].strip() if given[:7].lower() == "bearer " else ""
    token = token or headers.get("x-api-key", "").strip()
    candidate = token.encode("latin-1", "replace")
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(candidate, key)
    return ok


def _encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


_USAGE_OPTION = b'{"stream_options":{"include_usage":true}'
_JSON_SPACE = b" \t\r\n"


def with_usage_option(body: bytes) -> bytes | None:
    """``body``, a JSON object without "stream_options", with usage asked for: spliced in after
    its opening brace instead of re-encoding the whole request (which cost more than parsing
    it). None when the body is not plain UTF-8 text starting with ``{`` (json.loads also takes
    a BOM or UTF-16/32, whose first bytes hold a NUL or are not ``{``): then re-encode."""
    if b"\x00" in body[:4]:  # UTF-16/32 without a BOM: '{' is followed or preceded by NULs
        return None
    rest = body.lstrip(_JSON_SPACE)
    if rest[:1] != b"{":
        return None
    rest = rest[1:]
    return _USAGE_OPTION + (b"" if rest.lstrip(_JSON_SPACE)[:1] == b"}" else b",") + rest


class _TooManyFields(Exception):
    pass


# Nesting is bounded by Python's JSON parser itself (its recursion limit, about 1,000 levels),
# inline and in the thread alike, before any validation.
_TOO_DEEP = ("request body is nested too deeply (the limit is about 1,000 levels of arrays and "
             "objects): send a flatter body")


def parse_object(body: bytes, max_fields: int | None = None) -> dict[str, Any]:
    """The body's JSON object. With ``max_fields``, every object goes through a Python hook
    that counts its fields (the parse stops past the limit), which also lets other threads run
    while a large body is parsed."""
    if max_fields is None:
        # pydantic_core's parser first (2.5x faster on a prompt of 512 token ids, 6x on a short
        # body: the hot path parses every request inline). It refuses some bodies json.loads
        # takes (UTF-16/32 and BOMs, lone surrogates) and says other things about bad ones, so
        # on any refusal json.loads decides below, as before: what is accepted, what is
        # refused and every error text stay json.loads' (a generated test holds them equal).
        try:
            fast = from_json(body)
        except ValueError:
            pass
        else:
            if isinstance(fast, dict):
                return fast
    try:
        if max_fields is None:
            obj: object = jsontext.loads(body)
        else:
            fields = 0

            def counted(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
                nonlocal fields
                fields += len(pairs)
                if fields > max_fields:
                    raise _TooManyFields
                return dict(pairs)

            obj = json.loads(body, object_pairs_hook=counted)
    except _TooManyFields:
        raise BadRequest(f"request body has over {max_fields} object fields: send a smaller "
                         "request (the proxy's limit is --max-json-fields)") from None
    except UnicodeDecodeError:
        raise BadRequest("request body is not valid UTF-8") from None
    except (RecursionError, jsontext.NestedTooDeep):  # the counted parse's, the plain one's
        raise BadRequest(_TOO_DEEP) from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except ValueError:
        # Valid JSON: an integer longer than Python converts (its guard against quadratic
        # parsing), the one other ValueError json.loads raises. vLLM's parser stops there too.
        raise BadRequest(f"request body has an integer of over {sys.get_int_max_str_digits()} "
                         "digits, more than the proxy reads: send shorter numbers") from None
    if not isinstance(obj, dict):
        raise BadRequest("request body must be a JSON object")
    return obj


def check_bounds(obj: dict[str, Any], max_messages: int) -> None:
    messages = obj.get("messages")
    if isinstance(messages, list) and len(messages) > max_messages:
        raise BadRequest(f"messages: {len(messages)} messages, over the limit of {max_messages}"
                         ": shorten the conversation (the proxy's limit is --max-messages)",
                         param="messages")


def check_messages(messages: list[Any], start: int) -> None:
    """``messages``, items ``start``... of the request's list, validated as ChatMessage."""
    try:
        message_list.validate_python(messages)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = list(first["loc"])
        if loc and isinstance(loc[0], int):
            loc[0] += start
        param = ".".join(str(p) for p in ["messages", *loc])
        raise BadRequest(f"{param}: {first['msg']}", param=param) from None
    except RecursionError:
        raise BadRequest(_TOO_DEEP) from None


def check(schema: type[BaseModel], obj: dict[str, Any]) -> None:
    try:
        schema.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise BadRequest(f"{param or 'body'}: {first['msg']}", param=param) from None
    except RecursionError:
        raise BadRequest(_TOO_DEEP) from None


def _openapi_body(schema: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": inline_refs(schema.model_json_schema())}}}}


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema with its ``$defs`` substituted in place, so that it stands alone inside
    the OpenAPI document (where ``#/$defs/...`` would point at the document's root)."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(defs[ref.rsplit("/", 1)[1]])
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)  # type: ignore[no-any-return]


def create_app(cfg: ProxyConfig, registry: CollectorRegistry | None = None,
               seat: Seat | None = None) -> ProxyApp:
    disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series only double what Prometheus already knows
    proxy = Proxy(cfg, registry, seat)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        proxy.health.start()
        if proxy.samples_gpus:
            proxy.gpu.start()
        if proxy.peers is not None:
            await proxy.peers.start()
        try:
            yield
        finally:
            if proxy.peers is not None:
                await proxy.peers.stop()
            proxy.gpu.stop()
            await proxy.health.stop()
            proxy.relay.close()

    app = FastAPI(title="toposerve proxy", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible proxy in front of vLLM.")
    app.state.proxy = proxy
    _add_error_handlers(app, proxy)
    _add_routes(app, proxy)
    _add_head_routes(app)
    return ProxyApp(proxy, app)


def _add_head_routes(app: FastAPI) -> None:
    """HEAD wherever GET is served (RFC 9110 9.3.2: the GET's status and headers, no body;
    uvicorn leaves the body out): load balancers and uptime checkers probe /health and /ready
    with HEAD. Kept out of the OpenAPI schema, which stays the GET routes'. The catch-all
    relays HEAD to the engine itself; it is registered before it and so takes precedence."""
    for route in list(app.router.routes):
        if (isinstance(route, APIRoute) and route.methods == {"GET"}
                and route.path != "/{path:path}"):
            app.router.add_api_route(route.path, route.endpoint, methods=["HEAD"],
                                     include_in_schema=False)
    # FastAPI matches routes in order: the twins must come before the catch-all
    routes = app.router.routes
    catch_all = [r for r in routes if isinstance(r, APIRoute) and r.path == "/{path:path}"]
    for r in catch_all:
        routes.remove(r)
        routes.append(r)


def _add_routes(app: FastAPI, proxy: Proxy) -> None:
    errors = {str(c): {"description": d} for c, d in [
        (400, "Bad request (OpenAI error format)"), (401, "Missing or wrong API key"),
        (413, "Body too large"), (429, "Too many requests (Retry-After)"),
        (503, "Engine unavailable (Retry-After)")]}

    @app.post("/v1/chat/completions", openapi_extra=_openapi_body(ChatCompletionRequest),
              responses=errors)  # type: ignore[arg-type]
    async def chat_completions(request: Request) -> Response:
        return RelayResponse(proxy.generation)  # ProxyApp normally routes here before FastAPI

    @app.post("/v1/completions", openapi_extra=_openapi_body(CompletionRequest),
              responses=errors)  # type: ignore[arg-type]
    async def completions(request: Request) -> Response:
        return RelayResponse(proxy.generation)

    @app.get("/v1/models", responses=errors)  # type: ignore[arg-type]
    async def models(request: Request) -> Response:
        if proxy.router.serves_several_models:
            merged = await proxy.all_models(request)
            if merged is not None:
                return merged
        return await proxy.passthrough(request)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", responses={"503": {"description": "No engine answers yet"}})
    async def ready(request: Request) -> Response:
        return await proxy.ready(request)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return await proxy.metrics_text(request)

    @app.api_route("/{path:path}", methods=_METHODS, include_in_schema=False)
    async def relay_any(request: Request) -> Response:
        return await proxy.passthrough(request)


def _add_error_handlers(app: FastAPI, proxy: Proxy) -> None:
    def render(request: Request, exc: ProxyError) -> JSONResponse:
        rid = getattr(request.state, "request_id", None) or request_id(request)
        headers = {k.decode(): v.decode() for k, v in exc.headers()}
        headers["x-request-id"] = rid
        route = route_label(request.url.path)
        proxy.metrics.requests.labels("unknown", route, str(exc.status)).inc()
        log.info("%s %s %s %d", rid, request.method, route, exc.status)
        # Anthropic clients read errors in Anthropic's shape (server.anthropic).
        body = (anthropic.error_body(exc.status, exc.message, rid)
                if anthropic.is_anthropic(request.url.path) else exc.body())
        return JSONResponse(body, status_code=exc.status, headers=headers)

    @app.exception_handler(ProxyError)
    async def on_proxy_error(request: Request, exc: ProxyError) -> JSONResponse:
        return render(request, exc)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        allow = (exc.headers or {}).get("Allow")
        err: ProxyError
        if exc.status_code == 405 and allow:  # Starlette names the route's methods
            err = MethodNotAllowed(request.method, request.url.path, allow)
        else:
            err = NotFound(str(exc.detail)) if exc.status_code == 404 else BadRequest(
                str(exc.detail))
            err.status = exc.status_code
        return render(request, err)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return render(request, BadRequest(f"invalid request: {exc.errors()[:1]}"))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logging.getLogger("toposerve").error("internal error on %s: %s",
                                             route_label(request.url.path), type(exc).__name__)
        err = ProxyError("internal error in the proxy; see its log")
        return render(request, err)
