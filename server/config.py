"""The proxy's settings: one frozen dataclass, built from the command line and the environment.

API keys come from ``--api-key`` (repeatable), ``--api-key-file`` (one per line, ``#`` comments;
the file must not be readable by group or others) and ``TOPOSERVE_API_KEYS`` (comma-separated).
The environment is an argument, so tests pass a dict.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from server.errors import ConfigError

KEYS_ENV = "TOPOSERVE_API_KEYS"
PLAN_LABELS = ("mode", "tp", "pp", "dp", "engine", "transport", "model", "gpus")


@dataclass(frozen=True)
class ProxyConfig:
    upstreams: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()
    protect_metrics: bool = False
    plan_info: Mapping[str, str] = field(default_factory=dict)
    connect_timeout_s: float = 5.0
    first_byte_timeout_s: float = 600.0
    idle_timeout_s: float = 120.0
    body_timeout_s: float = 30.0
    header_timeout_s: float = 15.0
    max_body_bytes: int = 8 * 1024 * 1024
    max_in_flight: int = 1024
    max_queue: int = 1024
    queue_timeout_s: float = 30.0
    health_interval_s: float = 2.0
    affinity_slack: int = 4
    drain_timeout_s: float = 30.0
    log_level: str = "info"

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


def load_keys(flags: Sequence[str], key_file: str | None,
              env: Mapping[str, str]) -> tuple[str, ...]:
    keys = [k.strip() for k in flags]
    if key_file:
        keys += read_key_file(Path(key_file))
    keys += [k.strip() for k in env.get(KEYS_ENV, "").split(",")]
    return tuple(dict.fromkeys(k for k in keys if k))


def read_key_file(path: Path) -> list[str]:
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the API key file {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"the API key file {path} can be read by other users (mode {stat.S_IMODE(mode):o}); "
            f"run `chmod 600 {path}`")
    keys = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    keys = [k for k in keys if k]
    if not keys:
        raise ConfigError(f"the API key file {path} holds no key: put one key per line")
    return keys


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
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help=f"accepted API key (repeatable; also ${KEYS_ENV}, comma-separated)")
    p.add_argument("--api-key-file", metavar="FILE",
                   help="file with one API key per line (mode 600)")
    p.add_argument("--protect-metrics", action="store_true",
                   help="require the API key on /metrics too (default: open)")
    p.add_argument("--plan-info", metavar="JSON", help="plan labels for toposerve_plan_info")
    p.add_argument("--connect-timeout", type=float, default=5.0, metavar="S")
    p.add_argument("--first-byte-timeout", type=float, default=600.0, metavar="S")
    p.add_argument("--idle-timeout", type=float, default=120.0, metavar="S",
                   help="longest silence of the engine inside a stream")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                   help="longest time a client may take to send its request body")
    p.add_argument("--header-timeout", type=float, default=15.0, metavar="S",
                   help="longest time a client may take to send its request headers")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)
    p.add_argument("--max-in-flight", type=int, default=1024)
    p.add_argument("--max-queue", type=int, default=1024)
    p.add_argument("--queue-timeout", type=float, default=30.0, metavar="S")
    p.add_argument("--health-interval", type=float, default=2.0, metavar="S")
    p.add_argument("--affinity-slack", type=int, default=4, metavar="N",
                   help="a conversation keeps its replica unless that one has more than N "
                        "requests above the least busy (0: pure least-outstanding)")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                   help="on SIGTERM, how long in-flight requests may finish")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    return p


def config_from_args(argv: Sequence[str] | None = None,
                     env: Mapping[str, str] | None = None) -> ProxyConfig:
    a = build_parser().parse_args(argv)
    env = os.environ if env is None else env
    upstreams = tuple(u.rstrip("/") for u in a.upstream)
    for url in upstreams:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--upstream {url!r} must be an http:// URL, e.g. "
                              "http://127.0.0.1:8001")
    return ProxyConfig(
        upstreams=upstreams, host=a.host, port=a.port,
        api_keys=load_keys(a.api_key, a.api_key_file, env), protect_metrics=a.protect_metrics,
        plan_info=parse_plan_info(a.plan_info), connect_timeout_s=a.connect_timeout,
        first_byte_timeout_s=a.first_byte_timeout, idle_timeout_s=a.idle_timeout,
        body_timeout_s=a.body_timeout, header_timeout_s=a.header_timeout,
        max_body_bytes=a.max_body_bytes, max_in_flight=a.max_in_flight, max_queue=a.max_queue,
        queue_timeout_s=a.queue_timeout, health_interval_s=a.health_interval,
        affinity_slack=a.affinity_slack,
        drain_timeout_s=a.drain_timeout, log_level=a.log_level)
