"""`--depth D`: a new prompt after D tokens of context, the figure an agent's turn depends on.

Each measured request at depth D is D tokens of context followed by `--prompt` new tokens. By
default the context is already cached, as an agent's is: every request of the level shares it,
and one unmeasured request (the prime) sends it first. With `--depth-cold` every request has a
context of its own, so the server prefills all D + prompt tokens.

This is the standard workload with the prompt lengthened to D + prompt and, when cached, its
first D tokens shared (`--shared-prefix D`): the prompt material, the exact-count check against
usage and the request loop are the same. What is added is reading the level at its depth: the
cached tokens the server reports (usage.prompt_tokens_details.cached_tokens) and the prefill
rate of the new tokens alone.

Token counts take vLLM's human-readable form (its `--max-model-len`): a lowercase suffix is
decimal (8k = 8,000), an uppercase one binary (8K = 8,192).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation

from loadgen.config import Config
from loadgen.errors import BadArgument
from loadgen.stats import Dist, dist
from loadgen.timing import RequestResult

_DECIMAL = {"k": 10**3, "m": 10**6}
_BINARY = {"K": 2**10, "M": 2**20}
_TOKENS = re.compile(r"(\d+(?:\.\d+)?)([kKmM]?)")


def parse_tokens(text: str) -> int:
    """'8k' -> 8000, '8K' -> 8192, '32768' -> 32768, '1.5k' -> 1500; BadArgument otherwise."""
    match = _TOKENS.fullmatch(text.strip())
    if match is None:
        raise BadArgument(
            f"a token count is a whole number with an optional k/m (x1000) or K/M (x1024)"
            f" suffix, like 8k or 32768, not {text!r}"
        )
    number, suffix = match.groups()
    if suffix in _BINARY and "." in number:
        raise BadArgument(
            f"{text!r}: a binary suffix ({suffix}) takes a whole number; did you mean"
            f" {number}{suffix.lower()}?"
        )
    try:
        value = Decimal(number) * (_DECIMAL.get(suffix) or _BINARY.get(suffix) or 1)
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimal numbers
        raise BadArgument(f"{text!r} is not a number of tokens") from None
    if value != value.to_integral_value():
        raise BadArgument(f"{text!r} is not a whole number of tokens")
    return int(value)


def parse_depths(text: str) -> tuple[int, ...]:
    """'0,8k,32k' -> (0, 8000, 32000): the depths of a sweep, in the order given."""
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise BadArgument("--depth needs at least one token count, e.g. 0,8k,32k")
    return tuple(parse_tokens(part) for part in parts)


def depth_config(config: Config, depth: int) -> Config:
    """The standard run that measures at `depth`: prompt D + P; cached: the first D shared."""
    shared = 0 if config.depth_cold else depth
    return replace(config, prompt=depth + config.prompt, shared_prefix=shared, depth=())


@dataclass(frozen=True)
class DepthRun:
    """One depth of a run: what was asked, and the prime that cached the context (if any)."""

    tokens: int  # D, context tokens before the new ones
    new_tokens: int  # --prompt, the new tokens of every measured request
    cold: bool  # --depth-cold: every request's context its own
    prime: RequestResult | None = None  # the unmeasured request that cached the context

    @property
    def mode(self) -> str:
        return "cold" if self.cold else "cached"


@dataclass(frozen=True)
class DepthSummary:
    """A level read at its depth (pure, from its requests)."""

    cached_tokens: Dist  # usage.prompt_tokens_details.cached_tokens, where reported
    cached_reported: int  # successful requests whose usage had cached_tokens
    hit_rate: float | None  # cached / prompt tokens over the requests that reported it
    new_tokens: Dist  # prompt tokens (the server's count) less the depth
    prefill_new_tok_s: Dist  # new tokens / TTFT
    uncached_tok_s: Dist  # (prompt - cached) tokens / TTFT: what prefill really computed


def summarize_depth(depth: DepthRun, requests: Sequence[RequestResult]) -> DepthSummary:
    # (prompt tokens as the server counted them, cached tokens or None, TTFT) of each request
    # that succeeded with a first token
    rows = [
        (r.prompt_tokens, r.cached_tokens, r.ttft_s)
        for r in requests
        if r.ok and r.prompt_tokens is not None and r.ttft_s
    ]
    reported = [(p, c, t) for p, c, t in rows if c is not None]
    prompt_sum = sum(p for p, _, _ in reported)
    cached_sum = sum(c for _, c, _ in reported)
    return DepthSummary(
        cached_tokens=dist([float(c) for _, c, _ in reported]),
        cached_reported=len(reported),
        hit_rate=cached_sum / prompt_sum if prompt_sum else None,
        new_tokens=dist([float(p - depth.tokens) for p, _, _ in rows]),
        prefill_new_tok_s=dist([(p - depth.tokens) / t for p, _, t in rows]),
        uncached_tok_s=dist([(p - c) / t for p, c, t in reported]),
    )
