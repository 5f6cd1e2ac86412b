"""Recognise why vLLM failed to start from its log, say it in one sentence, and name a fallback.

Pure: log text in, diagnosis out. The supervisor retries once with a diagnosis' fallback (and tells
the user which setting it changed) instead of leaving them with a long traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Diagnosis:
    name: str
    sentence: str
    fallback_env: Mapping[str, str] = field(default_factory=dict)
    fallback_args: tuple[str, ...] = ()

    @property
    def retryable(self) -> bool:
        return bool(self.fallback_env or self.fallback_args)


@dataclass(frozen=True)
class Signature:
    diagnosis: Diagnosis
    all_of: tuple[re.Pattern[str], ...]


def _rx(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p, re.IGNORECASE) for p in patterns)


SYMM_MEM_FALLBACK_ARGS = (
    "--compilation-config",
    '{"pass_config":{"fuse_allreduce_rms":false}}',
)

# Seen on H200 machines with NVLink multicast switched off: torch's symmetric-memory all-reduce
# crashes during CUDA-graph capture. Turning it and the fused all-reduce+RMSNorm pass off fixes it.
SIGNATURES: tuple[Signature, ...] = (
    Signature(
        Diagnosis(
            "symm-mem-allreduce",
            "vLLM's symmetric-memory all-reduce crashed with an illegal memory access while "
            "capturing CUDA graphs (NVLink multicast is unavailable on this machine)",
            {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0"},
            SYMM_MEM_FALLBACK_ARGS,
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
            ("--disable-custom-all-reduce",),
        ),
        _rx(r"NCCL (error|WARN)", r"(unhandled (system|cuda) error|P2P)"),
    ),
    Signature(
        Diagnosis(
            "port-in-use",
            "the engine's internal port is already taken by another process",
        ),
        _rx(r"address already in use"),
    ),
)


def diagnose(log_text: str) -> Diagnosis | None:
    """The first known failure whose every pattern occurs in the log, or None."""
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


JSON_FLAGS = ("--compilation-config",)


def apply_fallback_args(argv: Sequence[str], extra: Sequence[str]) -> list[str]:
    """Add a fallback's flags to an engine command. A JSON-valued flag that is already present
    (``--compilation-config``) is merged into, not given twice, since vLLM keeps only the last
    occurrence and would drop the user's own settings (e.g. the CUDA-graph capture sizes)."""
    out = list(argv)
    i = 0
    while i < len(extra):
        flag = extra[i]
        value = extra[i + 1] if i + 1 < len(extra) else None
        if flag in JSON_FLAGS and value is not None and flag in out[:-1]:
            pos = len(out) - 1 - out[::-1].index(flag)
            if pos + 1 < len(out):
                out[pos + 1] = json.dumps(_deep_merge(_as_obj(out[pos + 1]), _as_obj(value)))
                i += 2
                continue
        out.append(flag)
        if value is not None and not value.startswith("--"):
            out.append(value)
            i += 1
        i += 1
    return out


def _as_obj(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
