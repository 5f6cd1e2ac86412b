"""Attention over a cached context, from `probe --measure`'s paired requests: the pure estimator.

Each round sends a prompt of new tokens after a cached context (the deep request) and, right
after it, a prompt of as many fresh tokens alone (the plain one); the deep one's extra time is
attention over the context. On a shared two-core machine one round's pair can run 2-3x slower
than the next (other work takes a core for seconds), so a difference of the rounds' medians read
43 ns a (query, key) pair in one loaded round where quiet ones read ~300 (issue 24). So:

- each pair is read on its own: the deep request's time over its own plain partner's, seconds
  apart (a slowdown that holds for both cancels), scaled by the plain prompts' median (the same
  median the prefill line, and so the plan, takes: the attention is on the plan's scale);
- a pair whose usage says the context was not found whole (fewer cached tokens than the best
  pair's: evicted, or not yet stored) is dropped, never read as attention;
- the kept figure is the median of the pairs' rates; the spread is their median absolute
  deviation over the median; and the rate is checked against the prefill per-token rate timed
  beside it: attention per pair over the per-token rate, relative to their FLOPs (the model's
  attention FLOPs a pair over 2 x the weights behind the per-token rate: its layers' alone in a
  format-5 record, where the LM head's row and the embedding's lookup are not per token),
  must fall in PLAUSIBLE;
- a reading with too few pairs, too wide a spread or an implausible median keeps the pairs'
  upper quartile where that is plausible (the slower side: a plan then errs towards slower
  turns at depth), else none (the plan says attention is untimed); the reason says which.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Fewer kept pairs than this give no spread worth the name.
MIN_PAIRS = 3
# The pairs' median absolute deviation over their median above which the median is not kept.
# Quiet rounds here: 302-306 ns in three rounds (~1%); pairs of a loaded round scatter wider.
MAX_SPREAD = 0.3
# (attention s per pair / prefill s per token) / (attention FLOPs per pair / 2 x active params):
# attention's time per FLOP over the prefill's. On this project's 2-core EPYC with the embedded
# model (4,096 FLOPs a pair, 5.0M params): quiet rounds 302-306 ns a pair at 1.41-1.43 ms a
# token, 0.52; the loaded round that read 43 ns at 3.14 ms, 0.033. The band is ~3.5x below and
# 4x above the quiet figure: a CPU whose attention kernel is that much faster or slower than its
# small GEMMs is possible, and then the reading is kept on the slow side or untimed, said so.
PLAUSIBLE = (0.15, 2.0)


@dataclass(frozen=True)
class DepthPair:
    """One round's deep request and its plain partner: times to first token, and the cached
    tokens the server's usage counted for the deep one."""

    plain_s: float
    deep_s: float
    cached: int


@dataclass(frozen=True)
class AttentionFit:
    """What the pairs say: ``pair_s`` is the rate the plan takes (None: untimed), ``why`` one
    line for the plan's reasons and the probe's output."""

    pair_s: float | None
    median_s: float | None  # the kept pairs' median rate (None: no pair kept)
    high_s: float | None  # their upper quartile
    kept: int
    dropped: int
    spread: float  # median absolute deviation / median (inf: no positive median)
    cached: int  # the context's tokens the kept pairs found cached
    plausibility: float | None  # the ratio PLAUSIBLE bounds (None: not checkable)
    reliable: bool
    why: str


def pair_rate(extra_s: float, *, depth: int, new: int, cached: int, token_s: float,
              host_token_s: float) -> float:
    """Seconds per (query, key) pair: the deep request's ``extra_s`` over the plain one, less
    what else it computed: the context's tokens the cache did not hold (vLLM caches whole
    blocks; at ``token_s``, the prefill per-token rate timed beside it) and the host's cost of
    the context's length (``host_token_s`` a prompt token), over the pairs of the computed tokens
    and the cached ones. May be negative (noise); ``cached`` must be positive."""
    computed = new + depth - cached
    rest = extra_s - (computed - new) * token_s - depth * host_token_s
    return rest / (computed * cached)


def plausibility(pair_s: float, *, token_s: float, pair_flops: float | None,
                 params: int) -> float | None:
    """Attention's time per FLOP over the prefill's (see PLAUSIBLE); None without the FLOPs."""
    if not pair_flops or pair_flops <= 0 or params <= 0 or token_s <= 0:
        return None
    return (pair_s / token_s) / (pair_flops / (2.0 * params))


def _upper_quartile(values: Sequence[float]) -> float:
    s = sorted(values)
    return s[math.ceil(0.75 * (len(s) - 1))]


def fit(pairs: Sequence[DepthPair], *, depth: int, new: int, token_s: float,
        host_token_s: float, pair_flops: float | None, params: int) -> AttentionFit:
    """The attention rate from the rounds' pairs (module docstring)."""
    best = max((p.cached for p in pairs), default=0)
    kept = [p for p in pairs if p.cached == best and p.plain_s > 0]
    dropped = len(pairs) - len(kept)
    if not kept or best <= 0:
        return AttentionFit(None, None, None, 0, len(pairs), math.inf, 0, None, False,
                            "attention over a cached context not timed: the context was not "
                            "found in the prefix cache")
    scale = statistics.median(p.plain_s for p in kept)
    hit = min(best, depth)
    rates = [pair_rate((p.deep_s / p.plain_s - 1.0) * scale, depth=depth, new=new, cached=hit,
                       token_s=token_s, host_token_s=host_token_s) for p in kept]
    med = statistics.median(rates)
    high = _upper_quartile(rates)
    spread = (statistics.median(abs(r - med) for r in rates) / med) if med > 0 else math.inf
    check = plausibility(max(0.0, med), token_s=token_s, pair_flops=pair_flops, params=params)
    lo, hi = PLAUSIBLE
    faults = []
    if len(kept) < MIN_PAIRS:
        faults.append(f"{len(kept)} pair(s) kept, fewer than {MIN_PAIRS}")
    if spread > MAX_SPREAD:
        faults.append(f"the pairs spread {spread:.0%} about their median (over "
                      f"{MAX_SPREAD:.0%})" if math.isfinite(spread) else
                      "the pairs' median is not positive")
    if check is not None and not lo <= check <= hi:
        faults.append(f"{max(0.0, med) * 1e9:.0f} ns a pair is {check:.2f}x the prefill's time "
                      f"per FLOP (plausible {lo}-{hi}x)")
    found = (f"{best:,} of {depth:,} context tokens found cached" +
             (f", {dropped} pair(s) that found fewer dropped" if dropped else ""))
    if not faults:
        return AttentionFit(med, med, high, len(kept), dropped, spread, best, check, True,
                            f"attention over a cached context {med * 1e9:.0f} ns a (query, key) "
                            f"pair, timed here (median of {len(kept)} paired requests, spread "
                            f"{spread:.0%}; {found})")
    high_check = plausibility(high, token_s=token_s, pair_flops=pair_flops, params=params)
    why = "; ".join(faults)
    if high > 0 and (high_check is None or lo <= high_check <= hi):
        return AttentionFit(high, med, high, len(kept), dropped, spread, best, check, False,
                            f"attention over a cached context timed unreliably ({why}; "
                            f"{found}): the pairs' upper quartile {high * 1e9:.0f} ns a "
                            f"(query, key) pair kept, the slower side, their median read "
                            f"{med * 1e9:.0f} ns")
    return AttentionFit(None, med, high, len(kept), dropped, spread, best, check, False,
                        f"attention over a cached context not timed: the timing was unreliable "
                        f"({why}; the upper quartile {high * 1e9:.0f} ns no better; {found}); "
                        "`launcher probe --measure` on a quieter machine times it again")
