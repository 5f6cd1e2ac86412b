"""What `launcher serve` will start, decided before anything starts: pure, printable, testable.

A plan with ``dp`` replicas becomes ``dp`` vLLM servers, each on its own slice of the plan's GPUs
and its own internal port, all behind the one proxy (which routes with prefix affinity, so each
conversation keeps hitting the replica whose prefix cache holds it).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    host: str
    port: int

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


def replica_specs(
    rendered_argv: Sequence[str],
    rendered_env: Mapping[str, str],
    dp: int,
    host: str,
    first_port: int,
    bind: str | None = None,
) -> tuple[ReplicaSpec, ...]:
    """Split one rendered `vllm serve` command into ``dp`` replicas on their own GPUs and ports.

    vLLM listens on ``bind`` (default ``host``); the proxy reaches it at ``host``.
    """
    base = _drop_flag(_drop_flag(list(rendered_argv), "--port"), "--data-parallel-size")
    base = _drop_flag(base, "--host")
    devices = [d for d in rendered_env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    per = len(devices) // dp if devices and dp > 0 else 0
    replicas = []
    for i in range(max(dp, 1)):
        env = dict(rendered_env)
        if per:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices[i * per : (i + 1) * per])
        port = first_port + i
        # Right after the model, so the user's own flags (at the end) stay last and win.
        argv = (*base[:3], "--host", bind or host, "--port", str(port), *base[3:])
        replicas.append(ReplicaSpec(argv, env, host, port))
    return tuple(replicas)


def _drop_flag(argv: list[str], flag: str) -> list[str]:
    """Remove ``flag VALUE`` and ``flag=VALUE`` occurrences."""
    out: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
            continue
        if item == flag:
            skip = True
            continue
        if item.startswith(flag + "="):
            continue
        out.append(item)
    return out


def command_line(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """A copy-pasteable shell line for one replica: only the variables the plan sets."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return (prefix + " " if prefix else "") + shlex.join(argv)
