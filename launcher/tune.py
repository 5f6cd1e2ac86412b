"""`launcher tune`'s pure core: candidate specs, scores from loadgen results, the winner.

The planner predicts on paper; tune measures. Each candidate is a forced split (tp/pp/dp) plus any
extra vLLM flags, so on a CPU-only machine two engine settings can be compared the same way as
TP against PP on GPUs.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.errors import LauncherError

SPLIT_KEYS = ("tp", "pp", "dp")


@dataclass(frozen=True)
class CandidateSpec:
    name: str
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    vllm_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Measured:
    candidate: CandidateSpec
    ok: bool
    summary: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None


def parse_candidate(text: str) -> CandidateSpec:
    """``"tp=2"``, ``"pp=2 name=layers"``, ``"name=small --max-num-batched-tokens 256"``."""
    tokens = shlex.split(text)
    split: dict[str, int] = {}
    name = None
    rest: list[str] = []
    for i, tok in enumerate(tokens):
        if tok.startswith("--"):
            rest = tokens[i:]
            break
        key, sep, value = tok.partition("=")
        if not sep:
            raise LauncherError(f"candidate {text!r}: expected key=value before vLLM flags, got "
                                f"{tok!r} (e.g. 'tp=2', 'pp=2', 'name=x --max-num-seqs 8')")
        if key == "name":
            name = value
        elif key in SPLIT_KEYS and value.isdigit() and int(value) > 0:
            split[key] = int(value)
        else:
            raise LauncherError(f"candidate {text!r}: unknown or invalid {tok!r}; use tp=N, "
                                "pp=N, dp=N, name=NAME, then vLLM flags")
    label = name or " ".join([*(f"{k}={v}" for k, v in split.items()), *rest]) or "default"
    return CandidateSpec(label, split.get("tp"), split.get("pp"), split.get("dp"), tuple(rest))


def _stat(summary: Mapping[str, Any], key: str, stat: str = "p50") -> float | None:
    value = summary.get(key)
    if isinstance(value, Mapping):
        got = value.get(stat)
        return float(got) if isinstance(got, (int, float)) else None
    return float(value) if isinstance(value, (int, float)) else None


def score(summary: Mapping[str, Any], workload: str, gen_tokens: int) -> float | None:
    """Higher is better. Interactive: one request's whole answer per second (TTFT plus the
    time to generate the rest, p50s); throughput: aggregate output tokens per second."""
    if not summary or summary.get("requests_ok", 0) == 0 or summary.get("requests_failed", 0):
        return None
    if workload == "throughput":
        return _stat(summary, "output_tok_s")
    ttft = _stat(summary, "ttft_s")
    decode = _stat(summary, "decode_tok_s")
    if ttft is None or not decode:
        return None
    return 1.0 / (ttft + (gen_tokens - 1) / decode)


def winner(results: Sequence[Measured], workload: str, gen_tokens: int) -> Measured:
    scored = [(score(r.summary, workload, gen_tokens), r) for r in results if r.ok]
    valid = [(s, r) for s, r in scored if s is not None]
    if not valid:
        reasons = "; ".join(f"{r.candidate.name}: {r.error or 'no valid measurement'}"
                            for r in results)
        raise LauncherError(f"no candidate could be measured ({reasons})")
    return max(valid, key=lambda pair: pair[0])[1]
