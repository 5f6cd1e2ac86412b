"""Run configuration: one frozen value that the CLI builds and the Python API takes."""

from __future__ import annotations

import math
import os
import re
import secrets
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from loadgen.errors import BadArgument
from loadgen.schedule import ARRIVALS
from loadgen.slo import Slo


def _url_parses(url: str) -> bool:
    """Whether both clients read ``url``: the timed transport (Endpoint.parse) and the
    control-plane one (httpx). Port 0 is refused too (Endpoint would take it for the default)."""
    from urllib.parse import urlsplit

    import httpx

    from loadgen.transport import Endpoint

    try:
        Endpoint.parse(url)
        httpx.URL(url)
        return urlsplit(url).port != 0
    except (ValueError, httpx.InvalidURL):
        return False


DEFAULT_URL = "http://127.0.0.1:8000"
WORKLOADS = ("standard", "agent")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# Labels loadgen sets itself; `plan` may be overridden (e.g. for a server without plan_info).
FIXED_LABELS = (
    "run_id", "model", "prompt", "gen", "concurrency", "stat", "outcome", "job", "depth",
    "depth_mode", "turn",
)


@dataclass(frozen=True)
class Config:
    url: str = DEFAULT_URL
    model: str | None = None
    api_key: str | None = None
    prompt: int = 512
    gen: int = 256
    chat: bool = False
    shared_prefix: int = 0
    # A fresh seed per run unless one is given: prompts repeated from an earlier run against the
    # same server would be served from vLLM's prefix cache and fake the prefill figures. The seed
    # used is recorded in the JSON, so `--seed` reproduces a run (cache and all).
    seed: int = field(default_factory=lambda: secrets.randbits(31))
    concurrency: int | None = None  # None: 1 in closed loop, no cap in open loop
    rate: float | None = None
    arrivals: str = "poisson"
    requests: int | None = None  # None with no duration: a default per concurrency
    duration: float | None = None
    # Unmeasured requests before each level; None: one per stream, at least 2 (the engine's
    # first requests after start-up are slow: compilation, allocation, cold caches).
    warmup: int | None = None
    sweep: tuple[int, ...] = ()
    processes: int = 1  # event loops (one per process) that share the load
    pptg: bool = False
    repetitions: int = 5
    timeout_s: float = 600.0
    json_path: Path | None = None
    csv_path: Path | None = None
    plot_path: Path | None = None
    pushgateway: str | None = None
    metrics_port: int | None = None
    metrics_linger: float = 15.0
    labels: tuple[tuple[str, str], ...] = ()
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    progress: bool = True
    # A Hugging Face tokenizer (directory or hub id) to count prompts with, instead of the
    # target's /tokenize; it also counts output when the server sends no usage.
    tokenizer: str | None = None
    # A prompt count of --tokenizer that differs from the server's usage is reported and the
    # request kept (a BOS token, a template, another tokenizer); True: such a request fails.
    strict_counts: bool = False
    # --depth: one level per depth, each request D context tokens + --prompt new ones; the
    # context cached (shared, sent once first) unless depth_cold (loadgen/depth.py).
    depth: tuple[int, ...] = ()
    depth_cold: bool = False
    # "agent": sessions that resend a growing conversation (loadgen/agent.py).
    workload: str = "standard"
    sessions: int = 4
    turns: int = 10
    context: tuple[int, int] | None = None  # (turn 1, last turn) prompt tokens; None: fitted
    think_s: float = 1.0  # pause between a session's turns
    # --soak-tokens N: the sessions keep taking turns, each adding turn_tokens, until their
    # conversation has crossed N tokens (turns and context derived: soaked()).
    soak_tokens: int | None = None
    turn_tokens: int = 2000
    # --system-tokens N: the system prompt every session opens with, the same in all (an agent's
    # instructions, cached across sessions); None: a quarter of turn 1 (loadgen/agent.py
    # system_tokens); 0: none, each session's first turn is its own
    system_tokens: int | None = None
    # Service-level objectives per request (None: not judged) and the share of requests that
    # must meet them for a level to count as meeting the SLO (sweep: highest such level).
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_share: float = 0.9
    metrics_url: str | None = None  # engine /metrics (vllm:prefix_cache_*), default: the target
    # toposerve GPU metrics sampling interval during the run; 0: no sampling
    gpu_sample_s: float = 2.0

    def levels(self) -> tuple[int | None, ...]:
        """Concurrency of each run: the sweep's, or the single one."""
        if self.sweep:
            return self.sweep
        return (self.concurrency if self.rate else self.concurrency or 1,)

    def warmup_for(self, concurrency: int | None) -> int:
        """Unmeasured requests before a level at `concurrency` (--warmup, else one per stream,
        at least 2)."""
        return self.warmup if self.warmup is not None else max(2, concurrency or 1)

    def requests_for(self, concurrency: int | None) -> int | None:
        if self.duration is not None:
            return self.requests
        if self.requests is not None:
            return self.requests
        return max(8, 4 * (concurrency or 1))

    def slo(self) -> Slo | None:
        """The objectives to judge requests by, or None when none was given."""
        if self.slo_ttft_ms is None and self.slo_tpot_ms is None:
            return None
        ttft = self.slo_ttft_ms / 1000 if self.slo_ttft_ms is not None else None
        tpot = self.slo_tpot_ms / 1000 if self.slo_tpot_ms is not None else None
        return Slo(ttft, tpot, self.slo_share)

    def public(self) -> dict[str, Any]:
        """The config as written to --json (no API key)."""
        data = asdict(self)
        data["api_key"] = "***" if self.api_key else None
        for key in ("json_path", "csv_path", "plot_path"):
            data[key] = str(data[key]) if data[key] else None
        data["labels"] = dict(self.labels)
        data["sweep"] = list(self.sweep)
        data["context"] = list(self.context) if self.context else None
        data["depth"] = list(self.depth)
        return data


def validate(config: Config) -> Config:
    """BadArgument for any value that cannot work; returns the config unchanged otherwise."""
    checks: list[tuple[bool, str]] = [
        (config.prompt >= 1, f"--prompt must be at least 1 token, not {config.prompt}"),
        (config.gen >= 1, f"--gen must be at least 1 token, not {config.gen}"),
        (
            0 <= config.shared_prefix < config.prompt or config.shared_prefix == 0,
            f"--shared-prefix {config.shared_prefix} must be below --prompt {config.prompt}",
        ),
        (config.concurrency is None or config.concurrency >= 1, "--concurrency must be at least 1"),
        (
            config.rate is None or 0 < config.rate < math.inf,
            "--rate must be a finite number above 0 requests/s",
        ),
        (config.arrivals in ARRIVALS, f"--arrivals must be one of {', '.join(ARRIVALS)}"),
        (config.requests is None or config.requests >= 1, "--requests must be at least 1"),
        (
            config.duration is None or 0 < config.duration < math.inf,
            "--duration must be a finite number of seconds above 0",
        ),
        (config.warmup is None or config.warmup >= 0, "--warmup cannot be negative"),
        (
            all(c >= 1 for c in config.sweep),
            "--sweep takes concurrencies of at least 1, e.g. 1,2,4,8",
        ),
        (
            not (config.sweep and config.rate),
            "--sweep varies concurrency; it cannot be combined with --rate",
        ),
        (config.repetitions >= 1, "--repetitions must be at least 1"),
        (config.processes >= 1, "--processes must be at least 1"),
        (
            config.processes == 1
            or config.rate is not None
            or all((c or 1) >= config.processes for c in config.levels()),
            f"--processes {config.processes} needs at least that many concurrent streams:"
            " raise --concurrency or lower --processes",
        ),
        (not (config.pptg and config.processes > 1), "--pptg is single-stream: drop --processes"),
        (
            0 <= config.metrics_linger < math.inf,
            "--metrics-linger must be a finite number of seconds, 0 or more",
        ),
        (0 < config.timeout_s < math.inf, "--timeout must be a finite number above 0 seconds"),
        (
            config.metrics_port is None or 0 <= config.metrics_port <= 65535,
            f"--metrics-port must lie between 0 and 65535, not {config.metrics_port}",
        ),
        (not config.plot_path or bool(config.sweep), "--plot draws a sweep: add --sweep 1,2,4,..."),
        (
            config.url.startswith(("http://", "https://")),
            f"--url must start with http:// or https://, not {config.url!r}",
        ),
        (
            config.metrics_url is None or (config.metrics_url.startswith(("http://", "https://"))
                                           and _url_parses(config.metrics_url)),
            f"--metrics-url {config.metrics_url!r} is not an http(s) URL, e.g."
            " http://127.0.0.1:8100/metrics",
        ),
        (
            not config.url.startswith(("http://", "https://")) or _url_parses(config.url),
            f"--url {config.url!r} is not a URL loadgen can reach (host, optional :port), e.g."
            " http://127.0.0.1:8000",
        ),
        (config.workload in WORKLOADS, f"--workload must be one of {', '.join(WORKLOADS)}"),
        (config.sessions >= 1, "--sessions must be at least 1"),
        (config.turns >= 1, "--turns must be at least 1"),
        (0 <= config.think_s < math.inf, "--think must be a finite number of seconds, 0 or more"),
        (
            config.context is None or 1 <= config.context[0] <= config.context[1],
            "--context takes FIRST:LAST prompt tokens with 1 <= FIRST <= LAST, e.g. 2000:30000",
        ),
        (
            config.workload != "agent"
            or not (config.sweep or config.rate or config.pptg or config.processes > 1),
            "--workload agent sets its own load (--sessions, --turns, --think): drop --sweep,"
            " --rate, --pptg and --processes",
        ),
        (all(d >= 0 for d in config.depth), "--depth takes token counts of 0 or more"),
        (
            not config.depth or not (config.pptg or config.workload == "agent" or config.rate),
            "--depth measures closed-loop levels at a context depth: drop --pptg, --rate and"
            " --workload agent",
        ),
        (not config.depth or config.shared_prefix == 0,
         "--depth sets the shared context itself: drop --shared-prefix"),
        (not config.depth_cold or bool(config.depth), "--depth-cold needs --depth D"),
        (
            # without it the counts are the server's own (/tokenize: a mismatch fails anyway) or
            # calibrated from its usage (nothing to be strict against): the flag would do nothing
            not config.strict_counts or bool(config.tokenizer),
            "--strict-counts checks the server's counts against --tokenizer's: add --tokenizer",
        ),
        (
            config.soak_tokens is None or config.soak_tokens >= 1,
            "--soak-tokens must be at least 1 token",
        ),
        (config.turn_tokens >= 1, "--turn-tokens must be at least 1 token"),
        (
            config.system_tokens is None or config.workload == "agent",
            "--system-tokens sets the agent sessions' shared system prompt: add --workload agent",
        ),
        (
            config.system_tokens is None or config.system_tokens >= 0,
            "--system-tokens takes a token count, 0 or more (0 or off: no system prompt)",
        ),
        (
            config.system_tokens is None or config.context is None
            or config.system_tokens < config.context[0],
            "--system-tokens must be below turn 1's tokens (--context FIRST): the first turn"
            " holds the system prompt and the session's own files",
        ),
        (
            config.soak_tokens is None or config.workload == "agent",
            "--soak-tokens grows agent sessions: add --workload agent",
        ),
        (
            config.slo_ttft_ms is None or 0 < config.slo_ttft_ms < math.inf,
            "--slo-ttft-ms must be a finite number above 0",
        ),
        (
            config.slo_tpot_ms is None or 0 < config.slo_tpot_ms < math.inf,
            "--slo-tpot-ms must be a finite number above 0",
        ),
        (0 < config.slo_share <= 1, "--slo-share must be above 0 and at most 1"),
        (
            0 <= config.gpu_sample_s < math.inf,
            "--gpu-sample must be a finite number of seconds, 0 or more (0 turns it off)",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise BadArgument(message)
    for key, _ in config.labels:
        if not _LABEL_NAME.match(key) or key.startswith("__") or key in FIXED_LABELS:
            raise BadArgument(
                f"--label {key}=...: not a label name loadgen can set; pick another name"
            )
    return config


def server_root(url: str) -> str:
    """The server a --url names: an OpenAI client's base URL (``.../v1``) is the server whose
    ``/v1/...`` loadgen asks for, so the ``/v1`` is not doubled."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def unwritable_output(config: Config) -> str | None:
    """Why a --json/--csv/--plot path cannot be written, asked before the run rather than
    found after a sweep of many minutes; None when all can be."""
    for option, path in (("--json", config.json_path), ("--csv", config.csv_path),
                         ("--plot", config.plot_path)):
        if path is None:
            continue
        folder = path.parent if str(path.parent) else Path(".")
        if path.is_dir():
            return f"{option} {path} is a folder; name a file in it"
        if not folder.is_dir():
            return f"{option} {path}: folder {folder} does not exist; create it or pick another"
        if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            return f"{option} {path} cannot be written here; pick a writable path"
    return None


def parse_label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise BadArgument(f"--label takes key=value, not {text!r}")
    return key.strip(), value


def parse_sweep(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise BadArgument(
            f"--sweep takes comma-separated integers like 1,2,4,8, not {text!r}"
        ) from None
    if not levels:
        raise BadArgument("--sweep needs at least one concurrency, e.g. 1,2,4,8")
    return levels


def parse_context(text: str) -> tuple[int, int]:
    """'2000:30000' -> (2000, 30000); a single number is both ends."""
    first, sep, last = text.partition(":")
    try:
        pair = (int(first), int(last if sep else first))
    except ValueError:
        raise BadArgument(
            f"--context takes FIRST:LAST prompt tokens like 2000:30000, not {text!r}"
        ) from None
    return pair


def soaked(config: Config, first_default: int) -> Config:
    """--soak-tokens N: the agent run whose sessions grow by --turn-tokens a turn from their
    first turn (--context FIRST, else `first_default`) until they have crossed N tokens."""
    if config.soak_tokens is None:
        return config
    first = config.context[0] if config.context else first_default
    first = min(first, config.soak_tokens)
    steps = -(-(config.soak_tokens - first) // config.turn_tokens)  # ceiling
    last = first + steps * config.turn_tokens
    return replace(config, turns=steps + 1, context=(first, last))
