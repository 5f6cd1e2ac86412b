"""What `launcher serve` will start, decided before anything starts: pure, printable, testable.

A plan with ``dp`` replicas becomes ``dp`` vLLM servers, each on its own slice of the plan's GPUs
and its own internal port, all behind the one proxy (which routes with prefix affinity, so each
conversation keeps hitting the replica whose prefix cache holds it).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from launcher.engine.enginecmd import EngineCommand


@dataclass(frozen=True)
class ReplicaSpec:
    """One vLLM server: its command, and where the proxy reaches it."""

    command: EngineCommand
    host: str  # loopback when the engine binds a wildcard address

    @property
    def port(self) -> int:
        return self.command.port

    @property
    def argv(self) -> tuple[str, ...]:
        return self.command.argv()

    @property
    def env(self) -> Mapping[str, str]:
        return self.command.env

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class LaunchSpec:
    model_ref: str
    served_name: str
    host: str
    port: int
    api_keys: tuple[str, ...]
    replicas: tuple[ReplicaSpec, ...]
    plan_info: Mapping[str, str]
    summary: tuple[str, ...]
    # vLLM's own key for this run (VLLM_API_KEY), which the proxy sends upstream: a web page
    # that reaches the engine's loopback port directly gets 401 on /v1. Never printed.
    engine_api_key: str | None = field(default=None, repr=False)
    proxy_args: tuple[str, ...] = ()  # the proxy's local-serving options (server/config.py)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def banner(self) -> str:
        """How to use what started, in lines that work as printed once OPENAI_API_KEY holds a
        key. A key itself is never printed: it may come from a key file, and this banner ends
        up in logs."""
        body = json.dumps(
            {"model": self.served_name, "messages": [{"role": "user", "content": "def fib(n):"}]}
        )
        if self.api_keys:
            key_lines = [
                "  export OPENAI_API_KEY=...   # one of the keys the proxy accepts (not shown "
                "here: --api-key, --api-key-file or TOPOSERVE_API_KEYS); the lines below read it",
            ]
            auth = ' -H "Authorization: Bearer $OPENAI_API_KEY"'
        else:
            key_lines = ["  export OPENAI_API_KEY=sk-unused   # the proxy checks no key"]
            auth = ""
        return "\n".join([
            "",
            f"[bold green]toposerve is ready[/] — OpenAI-compatible API at [bold]{self.base_url}[/]"
            f" serving model [bold]{self.served_name}[/]",
            "",
            "Point a client or coding agent at it:",
            f"  export OPENAI_BASE_URL={self.base_url}",
            *key_lines,
            f"  curl {self.base_url}/chat/completions{auth} -H 'Content-Type: application/json' \\",
            f"    -d {shlex.quote(body)}",
            f"  Aider: aider --openai-api-base {self.base_url} --openai-api-key \"$OPENAI_API_KEY\""
            f" --model openai/{self.served_name}",
            f"  Measure it: loadgen --url http://{self.host}:{self.port} --prompt 512 --gen 256"
            "   (reads $OPENAI_API_KEY)",
            f"  Metrics: http://{self.host}:{self.port}/metrics   Health: /health  /ready",
            "",
            "Ctrl-C (or SIGTERM) drains in-flight requests and stops everything.",
        ])


def replica_specs(engines: Sequence[EngineCommand], reach: Callable[[str], str]
                  ) -> tuple[ReplicaSpec, ...]:
    """The engines of a plan (one per replica), each with the address the proxy dials."""
    return tuple(ReplicaSpec(e, reach(e.host)) for e in engines)
