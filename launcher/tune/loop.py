"""`launcher tune`'s pure core: candidate specs, scores from loadgen results, the winner.

The planner predicts on paper; tune measures. Each candidate is a forced split (tp/pp/dp) plus any
extra vLLM flags, so on a CPU-only machine two engine settings can be compared the same way as
TP against PP on GPUs.

A candidate is measured in rounds (one loadgen run each, after unmeasured warm-up requests);
each round gives one score under the objective, and :mod:`launcher.tune.stats` puts a confidence
interval on them. Objectives:

- ``interactive``: one request's whole answer per second (TTFT + the rest of its tokens, p50s);
- ``throughput``: aggregate output tokens per second;
- ``slo``: the highest throughput among candidates whose requests meet ``--slo-ttft-ms`` and
  ``--slo-tpot-ms``: at least :data:`SLO_ATTAINMENT` of all its measured requests (every
  round) within both bounds. Each round's count is loadgen's own verdict (its JSON's
  ``summary.slo``) when it judged the same bounds, else tune judges request by request from
  loadgen's per-request rows (TTFT, and TPOT = (e2e - TTFT) / (tokens - 1)).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.errors import LauncherError
from launcher.tune.stats import Interval, clearly_behind, t_interval

SPLIT_KEYS = ("tp", "pp", "dp")
OBJECTIVES = ("interactive", "throughput", "slo")
# A candidate meets the SLO when this share of its requests is within both bounds (a p90 SLO:
# the usual way serving SLOs are stated; one slow request in ten is allowed, not more).
SLO_ATTAINMENT = 0.9


@dataclass(frozen=True)
class CandidateSpec:
    name: str
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    vllm_args: tuple[str, ...] = ()


def parse_candidate(text: str) -> CandidateSpec:
    """``"tp=2"``, ``"pp=2 name=layers"``, ``"name=small --max-num-batched-tokens 256"``."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:  # an unclosed quote or a trailing backslash
        raise LauncherError(f"candidate {text!r}: {exc} (quote each vLLM value whole, e.g. "
                            "name=x --served-model-name 'my model')") from None
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
        # isascii: str.isdigit() takes '²' and other digits int() refuses
        elif key in SPLIT_KEYS and value.isascii() and value.isdigit() and int(value) > 0:
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




# ------------------------------------------------------------------------------------ the SLO


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None

    @property
    def given(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None

    def describe(self) -> str:
        parts = []
        if self.ttft_ms is not None:
            parts.append(f"TTFT ≤ {self.ttft_ms:g} ms")
        if self.tpot_ms is not None:
            parts.append(f"TPOT ≤ {self.tpot_ms:g} ms")
        return " and ".join(parts) or "no SLO"


def resolve_objective(objective: str | None, workload: str, slo: Slo) -> str:
    """The objective asked for: ``--objective``, else ``slo`` when SLO bounds are given, else the
    workload. Inconsistent asks are one-line errors."""
    for label, bound in (("--slo-ttft-ms", slo.ttft_ms), ("--slo-tpot-ms", slo.tpot_ms)):
        if bound is not None and not (bound > 0 and math.isfinite(bound)):
            raise LauncherError(f"{label} must be a positive number of milliseconds, got {bound}")
    chosen = objective or ("slo" if slo.given else workload)
    if chosen not in OBJECTIVES:
        raise LauncherError(f"unknown objective {chosen!r}; use one of {', '.join(OBJECTIVES)}")
    if chosen == "slo" and not slo.given:
        raise LauncherError("--objective slo needs --slo-ttft-ms and/or --slo-tpot-ms")
    if chosen != "slo" and slo.given:
        raise LauncherError(f"--slo-ttft-ms/--slo-tpot-ms go with --objective slo, not {chosen}")
    return chosen


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def request_tpot_s(req: Mapping[str, Any]) -> float | None:
    """Time per output token after the first: (e2e - TTFT) / (tokens - 1); 0 for one token."""
    ttft, e2e, n = _num(req.get("ttft_s")), _num(req.get("e2e_s")), req.get("completion_tokens")
    if ttft is None or e2e is None or isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return None
    return 0.0 if n == 1 else max(0.0, e2e - ttft) / (n - 1)


def request_meets(req: Mapping[str, Any], slo: Slo) -> bool:
    """One request within both bounds; a failed request, or one without the figures, is not."""
    if req.get("error") is not None:
        return False
    if slo.ttft_ms is not None:
        ttft = _num(req.get("ttft_s"))
        if ttft is None or ttft * 1000 > slo.ttft_ms:
            return False
    if slo.tpot_ms is not None:
        tpot = request_tpot_s(req)
        if tpot is None or tpot * 1000 > slo.tpot_ms:
            return False
    return True


# ---------------------------------------------------------------------------- rounds, verdicts


@dataclass(frozen=True)
class Round:
    """One loadgen run: its summary and its per-request rows."""

    summary: Mapping[str, Any]
    requests: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_loadgen(cls, data: Mapping[str, Any]) -> Round:
        rows = data.get("requests")
        listed = rows if isinstance(rows, list) else []
        requests = tuple(r for r in listed if isinstance(r, Mapping))
        summary = data.get("summary")
        return cls(summary if isinstance(summary, Mapping) else {}, requests)

    def loadgen_slo(self, slo: Slo) -> Mapping[str, Any] | None:
        """loadgen's own SLO verdict of this run (summary["slo"]), when it judged the same
        bounds and its counts are sane; else None and tune counts from the request rows."""
        got = self.summary.get("slo")
        if not isinstance(got, Mapping):
            return None
        met, total = got.get("met"), got.get("total")
        same = (_num(got.get("ttft_ms")) == slo.ttft_ms
                and _num(got.get("tpot_ms")) == slo.tpot_ms)
        counts = (isinstance(met, int) and isinstance(total, int) and not isinstance(met, bool)
                  and not isinstance(total, bool) and 0 <= met <= total)
        return got if same and counts else None

    def slo_counts(self, slo: Slo) -> tuple[int, int]:
        """(requests within the SLO, requests) of this run."""
        theirs = self.loadgen_slo(slo)
        if theirs is not None:
            return int(theirs["met"]), int(theirs["total"])
        return sum(1 for row in self.requests if request_meets(row, slo)), len(self.requests)

    def goodput_tok_s(self, slo: Slo) -> float | None:
        """Output tokens of the requests within the SLO, per second of the run."""
        theirs = self.loadgen_slo(slo)
        if theirs is not None and _num(theirs.get("goodput_tok_s")) is not None:
            return _num(theirs.get("goodput_tok_s"))
        duration = _num(self.summary.get("duration_s"))
        if not duration or duration <= 0:
            return None
        good = sum(r.get("completion_tokens") or 0 for r in self.requests if request_meets(r, slo))
        return good / duration


@dataclass(frozen=True)
class Measured:
    """What tune measured of one candidate: its rounds (over every start of it), or why not."""

    candidate: CandidateSpec
    rounds: tuple[Round, ...] = ()
    error: str | None = None  # the engine or loadgen failed (rounds before that are kept)
    note: str | None = None  # e.g. measuring stopped early, and why

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.rounds)

    def plus(self, more: Measured) -> Measured:
        """Rounds of a re-run pooled with the earlier ones."""
        return Measured(self.candidate, self.rounds + more.rounds, more.error or self.error,
                        more.note or self.note)


@dataclass(frozen=True)
class Verdict:
    name: str
    scores: tuple[float, ...]  # one per round, under the objective
    interval: Interval | None
    slo_met: int = 0  # requests within the SLO, all rounds
    slo_total: int = 0
    meets_slo: bool | None = None  # None: the objective has no SLO
    excluded: str | None = None  # why it cannot win

    @property
    def eligible(self) -> bool:
        return self.excluded is None and self.interval is not None


def round_score(r: Round, objective: str, gen_tokens: int) -> float | None:
    return score(r.summary, "throughput" if objective == "slo" else objective, gen_tokens)


def judge(m: Measured, objective: str, gen_tokens: int, slo: Slo = Slo()) -> Verdict:
    """Scores, interval and SLO attainment of one candidate, and whether it may win."""
    raw = [round_score(r, objective, gen_tokens) for r in m.rounds]
    scores = tuple(s for s in raw if s is not None)
    excluded = m.error
    bad = [i + 1 for i, s in enumerate(raw) if s is None]
    if excluded is None and bad:
        excluded = f"round {bad[0]}: failed requests or no usable figures"
    if excluded is None and not m.rounds:
        excluded = "not measured"
    met = total = 0
    meets: bool | None = None
    if objective == "slo":
        counts = [r.slo_counts(slo) for r in m.rounds]
        met, total = sum(c[0] for c in counts), sum(c[1] for c in counts)
        meets = total > 0 and met >= SLO_ATTAINMENT * total
        if excluded is None and not meets:
            excluded = (f"misses the SLO: {met} of {total} requests within {slo.describe()} "
                        f"(needs {SLO_ATTAINMENT:.0%})")
    interval = t_interval(scores) if scores else None
    return Verdict(m.candidate.name, scores, interval, met, total, meets, excluded)


def stop_rounds(v: Verdict, rounds: int, rivals: Mapping[str, Interval], done: int,
                planned: int) -> str | None:
    """Why this start of a candidate measures no more rounds (None: go on).

    ``v`` judges all its rounds so far (``rounds`` of them, ``done`` in this start, of
    ``planned``). A failed round ends it (it cannot win); so does a candidate already measured
    being clearly ahead (interval wholly above this one's), or an SLO share that the rounds left
    can no longer lift to :data:`SLO_ATTAINMENT`, unless this was the last round anyway.
    """
    if len(v.scores) < rounds:
        return v.excluded or "a round failed"
    if done >= planned:
        return None
    if v.meets_slo is False and rounds:
        # even if every request still to come met the SLO, the share would stay below it
        left = (planned - done) * v.slo_total / rounds
        if v.slo_met + left < SLO_ATTAINMENT * (v.slo_total + left):
            return (f"stopped after {done} round(s): {v.slo_met} of {v.slo_total} requests "
                    f"within the SLO, it can no longer reach {SLO_ATTAINMENT:.0%}")
    if v.interval is None or not v.interval.bounded:
        return None
    ahead = clearly_behind(v.interval, rivals)
    return None if ahead is None else f"stopped after {done} round(s): {ahead} is clearly ahead"


def intervals_of(verdicts: Sequence[Verdict]) -> dict[str, Interval]:
    """The intervals of the candidates that may win (only those compete)."""
    return {v.name: v.interval for v in verdicts if v.eligible and v.interval is not None}


def choose(verdicts: Sequence[Verdict], objective: str, slo: Slo = Slo()) -> Verdict:
    """The best eligible candidate by mean score; a one-line error naming each when none is."""
    valid = [v for v in verdicts if v.eligible]
    if not valid:
        reasons = "; ".join(f"{v.name}: {v.excluded or 'no valid measurement'}" for v in verdicts)
        if objective == "slo" and any(v.meets_slo is False for v in verdicts):
            raise LauncherError(f"no candidate met {slo.describe()} ({reasons}); relax the "
                                "bounds, lower --concurrency, or add candidates")
        raise LauncherError(f"no candidate could be measured ({reasons})")
    return max(valid, key=lambda v: (v.interval.mean if v.interval else -math.inf, v.name))


def winner(results: Sequence[Measured], objective: str, gen_tokens: int,
           slo: Slo = Slo()) -> Measured:
    verdicts = [judge(r, objective, gen_tokens, slo) for r in results]
    best = choose(verdicts, objective, slo)
    return next(r for r in results if r.candidate.name == best.name)
