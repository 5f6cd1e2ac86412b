"""What `launcher serve` will start, decided before anything starts: pure, printable, testable.

A plan with ``dp`` replicas becomes ``dp`` vLLM servers, each on its own slice of the plan's GPUs
and its own internal port, all behind the one proxy (which routes with prefix affinity, so each
conversation keeps hitting the replica whose prefix cache holds it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from launcher.enginecmd import EngineCommand


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

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def banner(self) -> str:
        key = "<one of your --api-key values>" if self.api_keys else "unused"
        return "\n".join([
            "",
            f"[bold green]toposerve is ready[/] — OpenAI-compatible API at [bold]{self.base_url}[/]"
            f" serving model [bold]{self.served_name}[/]",
            "",
            "Point a client or coding agent at it:",
            f"  export OPENAI_BASE_URL={self.base_url}",
            f"  export OPENAI_API_KEY={key if self.api_keys else 'sk-unused'}",
            f"  curl {self.base_url}/chat/completions -H 'Content-Type: application/json' \\",
            f"    -d '{{\"model\": \"{self.served_name}\", \"messages\": "
            "[{\"role\": \"user\", \"content\": \"def fib(n):\"}]}'",
            f"  Aider: aider --openai-api-base {self.base_url} --model openai/{self.served_name}",
            f"  Measure it: loadgen --url http://{self.host}:{self.port} --prompt 512 --gen 256",
            f"  Metrics: http://{self.host}:{self.port}/metrics   Health: /health  /ready",
            "",
            "Ctrl-C (or SIGTERM) drains in-flight requests and stops everything.",
        ])


def replica_specs(engines: Sequence[EngineCommand], reach: Callable[[str], str]
                  ) -> tuple[ReplicaSpec, ...]:
    """The engines of a plan (one per replica), each with the address the proxy dials."""
    return tuple(ReplicaSpec(e, reach(e.host)) for e in engines)
