"""The proxy's settings: one frozen dataclass, built from the command line and the environment.

API keys come from ``--api-key`` (repeatable), ``--api-key-file`` (topocommon.keyfile: one a
line, ``#`` comment lines; not readable by group or others) and ``TOPOSERVE_API_KEYS``
(comma-separated).
The environment is an argument, so tests pass a dict.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from server import guard
from server.errors import ConfigError
from topocommon import keyfile

KEYS_ENV = keyfile.KEYS_ENV
ADMIN_KEYS_ENV = "TOPOSERVE_ADMIN_API_KEYS"
UPSTREAM_KEY_ENV = "TOPOSERVE_UPSTREAM_API_KEY"
PLAN_LABELS = ("mode", "tp", "pp", "dp", "engine", "transport", "model", "gpus")


@dataclass(frozen=True)
class ProxyConfig:
    upstreams: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()
    # Keys for vLLM's admin and development routes (server.app.ADMIN_PATHS): without one they
    # are refused to everyone; user keys never open them.
    admin_api_keys: tuple[str, ...] = ()
    protect_metrics: bool = False
    # Sent to the engines as a bearer token (a vLLM started with its own --api-key, a gateway);
    # the clients' own credentials never are.
    upstream_api_key: str | None = None
    plan_info: Mapping[str, str] = field(default_factory=dict)
    connect_timeout_s: float = 5.0
    # How long the engines keep an idle keep-alive connection open (vLLM: 5 s, its
    # VLLM_HTTP_TIMEOUT_KEEP_ALIVE): a pooled connection is reused for 1 s less than this, and
    # opened anew after (server.upstream.reuse_window).
    upstream_keep_alive_s: float = 5.0
    first_byte_timeout_s: float = 600.0
    idle_timeout_s: float = 120.0
    body_timeout_s: float = 30.0
    header_timeout_s: float = 15.0
    max_body_bytes: int = 8 * 1024 * 1024
    # Request heads, bounded as nginx and uvicorn-era servers do (431 past either).
    max_header_line_bytes: int = 16 * 1024
    max_header_bytes: int = 64 * 1024
    # Checked before full validation, so one request cannot hold the event loop for seconds.
    max_messages: int = 20_000
    max_json_fields: int = 250_000
    max_response_bytes: int = 64 * 1024 * 1024  # a non-streamed engine answer, buffered whole
    client_stall_timeout_s: float = 30.0  # a client whose socket takes nothing this long is cut
    gpu_interval_s: float = 5.0  # NVML is sampled in a thread this often; scrapes read the last
    max_in_flight: int = 1024
    max_queue: int = 1024
    queue_timeout_s: float = 30.0
    health_interval_s: float = 2.0
    affinity_slack: int = 4
    drain_timeout_s: float = 30.0
    log_level: str = "info"
    # Local-serving protections (server.guard): extra names the Host header may give, extra
    # origins a keyless proxy takes requests from ("*": any), media URLs inside allowed.
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    allow_internal_media: bool = False
    # Open client connections at most (server.conncap); None: from the descriptor limit.
    max_connections: int | None = None
    # Where the launcher says why no engine answers (server.enginestatus); None: nowhere.
    engine_status_file: str | None = None
    # Processes serving the port (server.workers); the limits above are totals over them.
    workers: int = 1

    def __post_init__(self) -> None:
        # Also for configs built in Python: a password in an engine URL would show in /ready,
        # in metric labels and in logs, which all name the engine by its URL.
        for url in self.upstreams:
            check_no_credentials(url)

    @property
    def loopback_only(self) -> bool:
        return is_loopback(self.host)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_keys(flags: Sequence[str], key_file: str | None, env: Mapping[str, str],
              flag: str = "--api-key", env_name: str = KEYS_ENV) -> tuple[str, ...]:
    """The keys given, read as the launcher reads them (topocommon.keyfile.given_keys)."""
    try:
        return keyfile.given_keys(flags, Path(key_file) if key_file else None,
                                  env.get(env_name, ""), flag=flag, env_name=env_name)
    except keyfile.KeyFileError as exc:
        raise ConfigError(str(exc)) from None


def parse_plan_info(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--plan-info must be a JSON object: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("--plan-info must be a JSON object of plan labels")
    return {k: _label(data.get(k)) for k in PLAN_LABELS}


def _label(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m server",
        description="OpenAI-compatible proxy in front of one or more vLLM engines.")
    p.add_argument("--upstream", action="append", required=True, metavar="URL",
                   help="vLLM base URL, e.g. http://127.0.0.1:8001 (repeat for replicas)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    p.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help=f"accepted API key (repeatable; also ${KEYS_ENV}, comma-separated)")
    p.add_argument("--api-key-file", metavar="FILE",
                   help="file with one API key per line (mode 600)")
    p.add_argument("--admin-api-key", action="append", default=[], metavar="KEY",
                   help="key that opens vLLM's admin and development routes (/sleep, "
                        f"/collective_rpc, LoRA loading, ...; also ${ADMIN_KEYS_ENV}); "
                        "without one they are refused")
    p.add_argument("--admin-api-key-file", metavar="FILE",
                   help="file with one admin key per line (mode 600)")
    p.add_argument("--upstream-api-key", metavar="KEY",
                   help=f"bearer token the engines require (vLLM's own --api-key); better "
                        f"${UPSTREAM_KEY_ENV}, which keeps it out of `ps`")
    p.add_argument("--protect-metrics", action="store_true",
                   help="require the API key on /metrics and /ready too (default: open)")
    p.add_argument("--plan-info", metavar="JSON", help="plan labels for toposerve_plan_info")
    p.add_argument("--connect-timeout", type=float, default=5.0, metavar="S",
                   help="longest wait for a connection to an engine (default 5)")
    p.add_argument("--upstream-keep-alive", type=float, default=5.0, metavar="S",
                   help="how long the engines keep an idle connection open (vLLM's "
                        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE, default 5): pooled connections are "
                        "reused for 1 s less than this")
    p.add_argument("--first-byte-timeout", type=float, default=600.0, metavar="S",
                   help="longest wait for an engine's first byte, a long prompt's prefill "
                        "included (default 600)")
    p.add_argument("--idle-timeout", type=float, default=120.0, metavar="S",
                   help="longest silence of the engine inside a stream (default 120)")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                   help="longest time a client may take to send its request body (default 30)")
    p.add_argument("--header-timeout", type=float, default=15.0, metavar="S",
                   help="longest time a client may take to send its request headers (default "
                        "15)")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024, metavar="N",
                   help="largest request body (413 past it; default 8388608, 8 MiB)")
    p.add_argument("--max-header-line-bytes", type=int, default=16 * 1024, metavar="N",
                   help="longest request line or header line (431 past it; default 16384)")
    p.add_argument("--max-header-bytes", type=int, default=64 * 1024, metavar="N",
                   help="largest request head, all lines together (431 past it; default "
                        "65536)")
    p.add_argument("--max-messages", type=int, default=20_000, metavar="N",
                   help="most messages in one chat request (400 past it; default 20000)")
    p.add_argument("--max-json-fields", type=int, default=250_000, metavar="N",
                   help="most object fields in one large request body (400 past it; default "
                        "250000)")
    p.add_argument("--max-response-bytes", type=int, default=64 * 1024 * 1024, metavar="N",
                   help="largest non-streamed engine answer (502 past it; default 67108864, "
                        "64 MiB)")
    p.add_argument("--client-stall-timeout", type=float, default=30.0, metavar="S",
                   help="a client whose socket accepts nothing for this long is disconnected "
                        "(counted as a client stall, never as an engine timeout; default 30)")
    p.add_argument("--gpu-interval", type=float, default=5.0, metavar="S",
                   help="how often NVML is sampled for toposerve_gpu_* (in a thread; default "
                        "5)")
    p.add_argument("--max-in-flight", type=int, default=1024, metavar="N",
                   help="requests sent on to the engines at once (default 1024)")
    p.add_argument("--max-queue", type=int, default=1024, metavar="N",
                   help="requests waiting for one of those places; 429 past it (default 1024)")
    p.add_argument("--queue-timeout", type=float, default=30.0, metavar="S",
                   help="longest wait in that queue; 429 past it (default 30)")
    p.add_argument("--health-interval", type=float, default=2.0, metavar="S",
                   help="how often each engine's /health is checked (default 2)")
    p.add_argument("--affinity-slack", type=int, default=4, metavar="N",
                   help="a conversation keeps its replica unless that one has more than N "
                        "requests above the least busy (0: pure least-outstanding; default 4)")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                   help="on SIGTERM, how long in-flight requests may finish (default 30)")
    p.add_argument("--allowed-hosts", action="append", default=[], metavar="NAMES",
                   help="names (comma-separated, repeatable) the Host header may give besides "
                        "localhost, 127.0.0.1, [::1] and --host; '*' turns the Host check off "
                        "(checked when bound to loopback or once this is given; bound "
                        "elsewhere without it, for clients on this machine, which may also use "
                        "any IP address or the machine's host name)")
    p.add_argument("--allowed-origins", action="append", default=[], metavar="ORIGINS",
                   help="web origins (scheme://host[:port], comma-separated, repeatable) a "
                        "proxy without API keys takes requests from besides its own and "
                        "loopback ones; '*' turns the Origin check off")
    p.add_argument("--allow-internal-media", action="store_true",
                   help="relay media URLs that point at this machine or a private network "
                        "(default: refused with 400, the engine would fetch them)")
    p.add_argument("--max-connections", type=int, default=None, metavar="N",
                   help="open client connections at most: idle ones are closed first, then "
                        "new ones get 503 (default: half the descriptor limit)")
    p.add_argument("--engine-status-file", metavar="PATH",
                   help="a file the launcher writes when its engines are down on purpose (a "
                        "multi-node group missing a node, or restarting): its reason becomes the "
                        "503's message (server/enginestatus.py)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="proxy processes sharing the port (SO_REUSEPORT; default 1): more "
                   "than one where the host has the cores and bursts are large; the limits "
                   "are totals split among them (docs/proxy.md, Workers)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="least severe log lines written (default info)")
    return p


def redact_url(url: str) -> str:
    """``url`` with any user name and password in its authority replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url if "@" not in url else "***@" + url.rpartition("@")[2]
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority = rest[:end]
    if "@" not in authority:
        return url
    return f"{scheme}://***@{authority.rpartition('@')[2]}{rest[end:]}"


def check_no_credentials(url: str) -> None:
    """Credentials in an engine URL are refused: the engines get a bearer token from
    --upstream-api-key instead, which is kept out of every URL the proxy shows."""
    _, sep, rest = url.partition("://")
    authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0] if sep else url
    if "@" in authority:
        raise ConfigError(
            f"--upstream {redact_url(url)!r} holds a user name or password: give the engine as "
            "http://HOST:PORT and its key with TOPOSERVE_UPSTREAM_API_KEY (or "
            "--upstream-api-key), sent as a bearer token")


def check_upstream(url: str) -> None:
    """An engine URL the proxy can reach: plain HTTP (vLLM serves HTTP; the proxy keeps
    keep-alive HTTP/1.1 connections to it), with a host and a port that parses, and no
    credentials in it. Shown redacted in every error."""
    check_no_credentials(url)
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
    except ValueError:  # "Invalid IPv6 URL" for an unclosed [
        raise ConfigError(f"--upstream {shown!r} must be an http:// URL, e.g. "
                          "http://127.0.0.1:8001") from None
    if parts.scheme == "https":
        raise ConfigError(
            f"--upstream {shown!r}: the proxy reaches its engines over plain http:// (vLLM's own "
            "server); give the engine's http://HOST:PORT, or terminate TLS in front of it")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme != "http" or not parts.hostname or port == -1:
        raise ConfigError(f"--upstream {shown!r} must be an http:// URL, e.g. "
                          "http://127.0.0.1:8001")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(
            f"--upstream {shown!r}: the proxy sends each request's own path (/v1/...) to the "
            f"engine's root, so a path here would be ignored; give http://{parts.netloc}")


def upstream_key(flag: str | None, env: Mapping[str, str]) -> str | None:
    """The engines' bearer token: the flag, else the environment; it goes into a header, so
    only visible ASCII without spaces."""
    key = flag if flag is not None else env.get(UPSTREAM_KEY_ENV)
    if key is None:
        return None
    if not key or not all(33 <= ord(c) <= 126 for c in key):
        raise ConfigError("--upstream-api-key must be visible ASCII without spaces (it is sent "
                          "as an HTTP header)")
    return key


def engine_root(url: str) -> str:
    """An engine URL as users write it for OpenAI clients, ``.../v1``, is the engine itself."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


# Seconds that must be finite and above 0, and counts that must be at least 1 (or 0).
_SECONDS = ("connect_timeout", "upstream_keep_alive", "first_byte_timeout", "idle_timeout",
            "body_timeout", "header_timeout", "client_stall_timeout", "gpu_interval",
            "queue_timeout", "health_interval")
_AT_LEAST_ONE = ("max_body_bytes", "max_header_line_bytes", "max_header_bytes", "max_messages",
                 "max_json_fields", "max_response_bytes", "max_in_flight", "workers")
_AT_LEAST_ZERO = ("max_queue", "affinity_slack")


def _names(values: Sequence[str]) -> tuple[str, ...]:
    """Repeated, comma-separated values as one tuple, blanks dropped."""
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


def check_numbers(a: argparse.Namespace) -> None:
    """Every numeric option in range, else a ConfigError naming it (one line)."""
    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    for name in _SECONDS:
        value = getattr(a, name)
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{flag(name)} must be above 0 seconds (and finite), not {value}")
    if not math.isfinite(a.drain_timeout) or a.drain_timeout < 0:
        raise ConfigError(f"--drain-timeout must be 0 or more seconds, not {a.drain_timeout}")
    for name in _AT_LEAST_ONE:
        if getattr(a, name) < 1:
            raise ConfigError(f"{flag(name)} must be above 0, not {getattr(a, name)}")
    for name in _AT_LEAST_ZERO:
        if getattr(a, name) < 0:
            raise ConfigError(f"{flag(name)} cannot be negative, not {getattr(a, name)}")
    if a.max_connections is not None and a.max_connections < 1:
        raise ConfigError(f"--max-connections must be above 0, not {a.max_connections}")
    if not 0 <= a.port <= 65535:
        raise ConfigError(f"--port must lie between 0 and 65535, not {a.port}")


def check_allow_lists(hosts: Sequence[str], origins: Sequence[str]) -> None:
    """Every --allowed-hosts name and --allowed-origins origin readable, else one line."""
    for host in hosts:
        if host != "*" and guard.split_host(host) is None:
            raise ConfigError(f"--allowed-hosts {host!r} is not a host name or address (e.g. "
                              "myhost.lan, 192.168.1.5, [fd00::5]), nor '*'")
    for origin in origins:
        if origin != "*" and guard.normal_origin(origin) is None:
            raise ConfigError(f"--allowed-origins {origin!r} is not an origin: write it as "
                              "the browser sends it, scheme://host[:port] (e.g. "
                              "http://myapp.lan:3000), or '*'")


def config_from_args(argv: Sequence[str] | None = None,
                     env: Mapping[str, str] | None = None) -> ProxyConfig:
    a = build_parser().parse_args(argv)
    env = os.environ if env is None else env
    upstreams = tuple(engine_root(u) for u in a.upstream)
    for url in upstreams:
        check_upstream(url)
    check_numbers(a)
    check_allow_lists(_names(a.allowed_hosts), _names(a.allowed_origins))
    return ProxyConfig(
        upstreams=upstreams, host=a.host, port=a.port,
        api_keys=load_keys(a.api_key, a.api_key_file, env),
        admin_api_keys=load_keys(a.admin_api_key, a.admin_api_key_file, env,
                                 "--admin-api-key", ADMIN_KEYS_ENV),
        protect_metrics=a.protect_metrics,
        upstream_api_key=upstream_key(a.upstream_api_key, env),
        plan_info=parse_plan_info(a.plan_info), connect_timeout_s=a.connect_timeout,
        upstream_keep_alive_s=a.upstream_keep_alive,
        first_byte_timeout_s=a.first_byte_timeout, idle_timeout_s=a.idle_timeout,
        body_timeout_s=a.body_timeout, header_timeout_s=a.header_timeout,
        max_body_bytes=a.max_body_bytes, max_header_line_bytes=a.max_header_line_bytes,
        max_header_bytes=a.max_header_bytes, max_messages=a.max_messages,
        max_json_fields=a.max_json_fields, max_response_bytes=a.max_response_bytes,
        client_stall_timeout_s=a.client_stall_timeout, gpu_interval_s=a.gpu_interval,
        max_in_flight=a.max_in_flight, max_queue=a.max_queue,
        queue_timeout_s=a.queue_timeout, health_interval_s=a.health_interval,
        affinity_slack=a.affinity_slack,
        drain_timeout_s=a.drain_timeout, log_level=a.log_level,
        allowed_hosts=_names(a.allowed_hosts), allowed_origins=_names(a.allowed_origins),
        allow_internal_media=a.allow_internal_media, max_connections=a.max_connections,
        engine_status_file=a.engine_status_file, workers=a.workers)
