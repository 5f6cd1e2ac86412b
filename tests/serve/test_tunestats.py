"""tune's pure core: intervals, early stop, finalists, and the winner under each objective.

Property tests (hypothesis) for the statistics and the decisions, table tests for the SLO
judgement of loadgen's per-request rows.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.errors import LauncherError
from launcher.tune.loop import (
    SLO_ATTAINMENT,
    CandidateSpec,
    Measured,
    Round,
    Slo,
    choose,
    intervals_of,
    judge,
    request_meets,
    request_tpot_s,
    resolve_objective,
    stop_rounds,
    winner,
)
from launcher.tune.stats import (
    Interval,
    clearly_ahead,
    clearly_behind,
    next_step,
    ranked,
    t_interval,
    t_quantile,
)

scores = st.floats(min_value=0.01, max_value=1e5, allow_nan=False, allow_infinity=False)
samples = st.lists(scores, min_size=2, max_size=12)
names = st.sampled_from(["a", "b", "c", "d", "e"])


def iv(mean: float, half: float, n: int = 3) -> Interval:
    return Interval(n, mean, mean - half, mean + half)


# ------------------------------------------------------------------------------ the interval


@given(samples)
def test_the_interval_holds_the_mean_and_is_bounded_from_two_rounds(values: list[float]) -> None:
    got = t_interval(values)
    assert got.n == len(values)
    assert got.low <= got.mean <= got.high
    assert got.bounded
    assert min(values) - 1e-6 * max(values) <= got.mean <= max(values) * (1 + 1e-9)


@given(samples, st.floats(min_value=-1e3, max_value=1e3), st.floats(min_value=0.1, max_value=10))
def test_the_interval_moves_and_scales_with_the_scores(
    values: list[float], shift: float, scale: float
) -> None:
    base = t_interval(values)
    moved = t_interval([v * scale + shift for v in values])
    tol = 1e-6 * (abs(base.high) + abs(base.low) + 1) * (scale + abs(shift) + 1)
    assert moved.mean == pytest.approx(base.mean * scale + shift, abs=tol)
    assert moved.high - moved.low == pytest.approx((base.high - base.low) * scale, abs=tol)


@given(scores, st.integers(min_value=2, max_value=10))
def test_identical_rounds_give_a_point_interval(value: float, n: int) -> None:
    got = t_interval([value] * n)
    assert got.low == pytest.approx(value)
    assert got.high == pytest.approx(value)


@given(scores)
def test_one_round_gives_no_interval(value: float) -> None:
    got = t_interval([value])
    assert (got.low, got.mean, got.high) == (-math.inf, value, math.inf)
    assert not got.bounded


@pytest.mark.parametrize(("values", "mean", "half"), [
    # mean 11, s = 1, n = 3: half = t(0.975, 2) * 1/sqrt(3) = 4.303 / 1.732
    ([10.0, 11.0, 12.0], 11.0, 4.303 / math.sqrt(3)),
    ([100.0, 104.0], 102.0, 12.706 * math.sqrt(8) / math.sqrt(2)),
])
def test_the_interval_is_students_t(values: list[float], mean: float, half: float) -> None:
    got = t_interval(values)
    assert got.mean == pytest.approx(mean)
    assert got.high - got.mean == pytest.approx(half)


def test_t_quantiles_shrink_toward_the_normal_and_past_the_table_stay_wider() -> None:
    qs = [t_quantile(df) for df in range(1, 200)]
    assert all(a >= b for a, b in itertools.pairwise(qs))
    assert qs[-1] >= 1.96
    with pytest.raises(ValueError, match="two values"):
        t_quantile(0)


# ------------------------------------------------------------------------ ahead, behind, rerun

interval_maps = st.dictionaries(
    names,
    st.tuples(st.floats(min_value=1, max_value=100), st.floats(min_value=0, max_value=30)),
    min_size=1,
    max_size=5,
).map(lambda d: {k: iv(m, h) for k, (m, h) in d.items()})


@given(interval_maps)
def test_clearly_ahead_means_above_every_other_interval(ivs: dict[str, Interval]) -> None:
    leader = clearly_ahead(ivs)
    if leader is None:
        assert len(ivs) == 1 or not any(
            all(a.low > b.high for o, b in ivs.items() if o != k) for k, a in ivs.items()
        )
    else:
        assert all(ivs[leader].low > b.high for o, b in ivs.items() if o != leader)


@given(interval_maps, st.randoms())
def test_clearly_ahead_does_not_depend_on_the_order_measured(
    ivs: dict[str, Interval], rnd: Any
) -> None:
    keys = list(ivs)
    rnd.shuffle(keys)
    assert clearly_ahead({k: ivs[k] for k in keys}) == clearly_ahead(ivs)


@given(interval_maps, st.integers(min_value=0, max_value=3), st.integers(min_value=0, max_value=3))
def test_next_step_stops_early_on_a_clear_leader_and_else_reruns_overlapping_finalists(
    ivs: dict[str, Interval], done: int, most: int
) -> None:
    step = next_step(ivs, done, most)
    leader = clearly_ahead(ivs)
    if leader is not None:
        assert step.action == "done"
        assert step.names == (leader,)
    elif step.action == "rerun":
        assert done < most
        first, rival = step.names
        assert first == ranked(ivs)[0]
        assert ivs[first].overlaps(ivs[rival])
        assert first != rival
    else:
        assert len(ivs) == 1 or done >= most


def test_one_round_each_never_stops_early() -> None:
    ivs = {"a": t_interval([100.0]), "b": t_interval([1.0])}
    assert clearly_ahead(ivs) is None
    assert next_step(ivs, 0, 1).action == "rerun"


@pytest.mark.parametrize(("ivs", "done", "most", "action", "chosen"), [
    ({"a": iv(10, 1), "b": iv(5, 1), "c": iv(2, 1)}, 0, 1, "done", ("a",)),
    ({"a": iv(10, 3), "b": iv(8, 3), "c": iv(2, 1)}, 0, 1, "rerun", ("a", "b")),
    ({"a": iv(10, 3), "b": iv(8, 3)}, 1, 1, "done", ()),
    # the runner-up is told apart, a noisy third is not: the third is the leader's rival
    ({"a": iv(10, 1), "b": iv(7, 0.5), "c": iv(6, 5)}, 0, 2, "rerun", ("a", "c")),
    ({"a": iv(10, 1)}, 0, 1, "done", ("a",)),
])
def test_next_step_table(
    ivs: dict[str, Interval], done: int, most: int, action: str, chosen: tuple[str, ...]
) -> None:
    step = next_step(ivs, done, most)
    assert (step.action, step.names) == (action, chosen)


def test_a_candidate_is_clearly_behind_one_whose_interval_is_wholly_above() -> None:
    assert clearly_behind(iv(5, 1), {"a": iv(10, 1), "b": iv(6, 2)}) == "a"
    assert clearly_behind(iv(5, 1), {"b": iv(6, 2)}) is None


# ---------------------------------------------------------------------------- SLO per request


def req(ttft: float | None, e2e: float | None, tokens: int | None = 11,
        error: str | None = None) -> dict[str, Any]:
    return {"ttft_s": ttft, "e2e_s": e2e, "completion_tokens": tokens, "error": error}


@pytest.mark.parametrize(("row", "tpot"), [
    (req(0.5, 1.5, 11), 0.1),
    (req(0.5, 0.5, 1), 0.0),  # one token: nothing decoded after the first
    (req(None, 1.5), None),
    (req(0.5, 1.5, None), None),
    (req(0.5, 1.5, 0), None),
    ({"ttft_s": "fast", "e2e_s": 1.0, "completion_tokens": 3}, None),
    ({"ttft_s": 0.1, "e2e_s": float("nan"), "completion_tokens": 3}, None),
])
def test_time_per_output_token_from_a_request_row(row: dict[str, Any], tpot: float | None) -> None:
    assert request_tpot_s(row) == (None if tpot is None else pytest.approx(tpot))


@pytest.mark.parametrize(("row", "slo", "meets"), [
    (req(0.2, 1.2), Slo(300, 150), True),
    (req(0.4, 1.2), Slo(300, 150), False),  # TTFT over
    (req(0.2, 2.2), Slo(300, 150), False),  # TPOT 200 ms over
    (req(0.2, 2.2), Slo(ttft_ms=300), True),  # only TTFT bound
    (req(0.4, 1.2), Slo(tpot_ms=150), True),  # only TPOT bound
    (req(0.2, 1.2, error="HTTP 500"), Slo(300, 150), False),
    (req(None, 1.2), Slo(ttft_ms=300), False),  # no first token seen
])
def test_slo_judged_request_by_request(row: dict[str, Any], slo: Slo, meets: bool) -> None:
    assert request_meets(row, slo) is meets


@given(st.floats(min_value=0, max_value=5), st.floats(min_value=0, max_value=50),
       st.integers(min_value=1, max_value=512), st.floats(min_value=1, max_value=5000),
       st.floats(min_value=1, max_value=500), st.floats(min_value=1, max_value=3))
def test_looser_bounds_never_fail_a_request_that_met_tighter_ones(
    ttft: float, extra: float, tokens: int, ttft_ms: float, tpot_ms: float, looser: float
) -> None:
    row = req(ttft, ttft + extra, tokens)
    if request_meets(row, Slo(ttft_ms, tpot_ms)):
        assert request_meets(row, Slo(ttft_ms * looser, tpot_ms * looser))


@pytest.mark.parametrize(("objective", "workload", "slo", "want"), [
    (None, "interactive", Slo(), "interactive"),
    (None, "throughput", Slo(), "throughput"),
    (None, "interactive", Slo(ttft_ms=500), "slo"),
    ("slo", "interactive", Slo(tpot_ms=50), "slo"),
])
def test_objective_resolution(objective: str | None, workload: str, slo: Slo, want: str) -> None:
    assert resolve_objective(objective, workload, slo) == want


@pytest.mark.parametrize(("objective", "slo", "message"), [
    ("slo", Slo(), "needs --slo-ttft-ms"),
    ("throughput", Slo(ttft_ms=10), "go with --objective slo"),
    (None, Slo(ttft_ms=-1), "positive number"),
    (None, Slo(tpot_ms=float("inf")), "positive number"),
])
def test_inconsistent_objectives_are_one_line_errors(
    objective: str | None, slo: Slo, message: str
) -> None:
    with pytest.raises(LauncherError, match=message):
        resolve_objective(objective, "interactive", slo)


# ------------------------------------------------------------------------ winner per objective


def rnd(output: float, ttft: float = 0.1, decode: float = 50.0, rows: int = 10,
        tpot: float = 0.02, failed: int = 0, slow: int = 0) -> Round:
    """One round: ``rows`` requests of 11 tokens, ``slow`` of them with a 2 s first token."""
    requests = tuple(req(2.0 if i < slow else ttft, (2.0 if i < slow else ttft) + 10 * tpot)
                     for i in range(rows))
    summary = {"requests_ok": rows, "requests_failed": failed, "ttft_s": {"p50": ttft},
               "decode_tok_s": {"p50": decode}, "output_tok_s": output, "duration_s": 10.0}
    return Round(summary, requests)


def cand(name: str, *rounds: Round, error: str | None = None) -> Measured:
    return Measured(CandidateSpec(name), tuple(rounds), error)


def test_interactive_prefers_the_faster_whole_answer_not_the_faster_first_token() -> None:
    a = cand("a", rnd(100, ttft=0.05, decode=20), rnd(100, ttft=0.05, decode=21))
    b = cand("b", rnd(90, ttft=0.30, decode=40), rnd(90, ttft=0.31, decode=40))
    assert winner([a, b], "interactive", 256).candidate.name == "b"
    assert judge(a, "interactive", 256).scores[0] == pytest.approx(1 / (0.05 + 255 / 20.0))


def test_throughput_prefers_aggregate_output_tokens() -> None:
    a = cand("a", rnd(900), rnd(910), rnd(905))
    b = cand("b", rnd(600), rnd(620), rnd(610))
    assert winner([a, b], "throughput", 256).candidate.name == "a"


def test_slo_picks_the_highest_throughput_that_meets_the_bounds() -> None:
    fast_but_slow_first_token = cand("fast", rnd(900, slow=5), rnd(910, slow=4))
    meets = cand("meets", rnd(600), rnd(610, slow=1))  # 1 of 20 slow: 95% within
    slo = Slo(ttft_ms=500, tpot_ms=50)
    verdicts = [judge(m, "slo", 16, slo) for m in (fast_but_slow_first_token, meets)]
    assert [v.meets_slo for v in verdicts] == [False, True]
    assert (verdicts[1].slo_met, verdicts[1].slo_total) == (19, 20)
    assert choose(verdicts, "slo", slo).name == "meets"
    assert "misses the SLO: 11 of 20" in (verdicts[0].excluded or "")
    # without the SLO the faster one wins
    assert winner([fast_but_slow_first_token, meets], "throughput", 16).candidate.name == "fast"


def test_slo_attainment_threshold_is_inclusive() -> None:
    n = 20
    slow = n - math.ceil(SLO_ATTAINMENT * n)
    v = judge(cand("x", rnd(100, rows=n, slow=slow)), "slo", 16, Slo(ttft_ms=500))
    assert v.meets_slo is True
    v = judge(cand("x", rnd(100, rows=n, slow=slow + 1)), "slo", 16, Slo(ttft_ms=500))
    assert v.meets_slo is False


def test_no_candidate_meeting_the_slo_is_an_error_naming_each() -> None:
    slo = Slo(tpot_ms=1)
    verdicts = [judge(cand(k, rnd(100)), "slo", 16, slo) for k in ("a", "b")]
    with pytest.raises(LauncherError, match=r"no candidate met TPOT ≤ 1 ms \(a: misses"):
        choose(verdicts, "slo", slo)


def test_a_candidate_with_a_failed_round_cannot_win() -> None:
    a = cand("a", rnd(9999), rnd(9999, failed=1))
    b = cand("b", rnd(600), rnd(610))
    assert winner([a, b], "throughput", 256).candidate.name == "b"
    assert judge(a, "throughput", 256).excluded == "round 2: failed requests or no usable figures"


def test_no_measurable_candidate_is_an_error_naming_each() -> None:
    with pytest.raises(LauncherError, match="a: engine broke; b: not measured"):
        winner([cand("a", error="engine broke"), cand("b")], "interactive", 8)


def test_only_eligible_candidates_compete_for_the_early_stop() -> None:
    verdicts = [judge(cand("a", rnd(900), rnd(905)), "throughput", 16),
                judge(cand("b", rnd(100), rnd(101), error="engine died"), "throughput", 16)]
    assert set(intervals_of(verdicts)) == {"a"}


def test_rerun_rounds_pool_with_the_first_ones() -> None:
    first = cand("a", rnd(100), rnd(110))
    again = first.plus(cand("a", rnd(105), rnd(107)))
    v = judge(again, "throughput", 16)
    assert v.scores == (100, 110, 105, 107)
    assert v.interval is not None
    assert v.interval.n == 4


@given(st.dictionaries(names, st.lists(scores, min_size=1, max_size=4), min_size=1))
def test_the_winner_has_the_best_mean_of_the_candidates_that_may_win(
    by_name: dict[str, list[float]]
) -> None:
    ms = [cand(k, *(rnd(x) for x in xs)) for k, xs in by_name.items()]
    verdicts = [judge(m, "throughput", 16) for m in ms]
    best = choose(verdicts, "throughput")
    assert best.interval is not None
    assert best.interval.mean == max(v.interval.mean for v in verdicts if v.interval)


def test_a_loadgen_json_becomes_a_round_and_junk_rows_are_skipped() -> None:
    data = {"summary": {"output_tok_s": 5.0, "duration_s": 2.0},
            "requests": [req(0.1, 0.3, 5), "junk", req(0.9, 1.0, 5)]}
    r = Round.from_loadgen(data)
    assert len(r.requests) == 2
    assert r.goodput_tok_s(Slo(ttft_ms=500)) == pytest.approx(5 / 2.0)
    assert Round.from_loadgen({"summary": None, "requests": {}}) == Round({}, ())


def test_loadgens_own_slo_verdict_is_used_when_it_judged_the_same_bounds() -> None:
    slo = Slo(ttft_ms=500, tpot_ms=50)
    base = rnd(100, rows=10, slow=5)  # by the rows: 5 of 10 within
    theirs = {"ttft_ms": 500.0, "tpot_ms": 50.0, "met": 9, "total": 10, "goodput_tok_s": 42.0}
    agreed = Round({**base.summary, "slo": theirs}, base.requests)
    assert agreed.slo_counts(slo) == (9, 10)
    assert agreed.goodput_tok_s(slo) == 42.0
    # other bounds, or counts that cannot be: tune's own count from the rows
    for other in ({**theirs, "tpot_ms": 80.0}, {**theirs, "met": 11}, {**theirs, "met": True},
                  "yes"):
        r = Round({**base.summary, "slo": other}, base.requests)
        assert r.slo_counts(slo) == (5, 10)
    assert base.goodput_tok_s(slo) == pytest.approx(5 * 11 / 10.0)


@pytest.mark.parametrize(("rounds", "rivals", "done", "planned", "want"), [
    # clearly behind a candidate already measured, rounds left: stop early
    ((rnd(100), rnd(101)), {"a": iv(500, 10)}, 2, 3,
     "stopped after 2 round(s): a is clearly ahead"),
    ((rnd(100), rnd(101)), {"a": iv(500, 10)}, 3, 3, None),  # that was the last round anyway
    ((rnd(100), rnd(101)), {"a": iv(101, 10)}, 2, 3, None),  # overlapping: go on
    ((rnd(100),), {"a": iv(500, 10)}, 1, 3, None),  # one round: no interval yet
    ((rnd(100), rnd(101, failed=1)), {}, 2, 3, "round 2: failed requests or no usable figures"),
])
def test_rounds_of_a_start_stop_early_when_clearly_behind_or_failed(
    rounds: tuple[Round, ...], rivals: dict[str, Interval], done: int, planned: int,
    want: str | None
) -> None:
    v = judge(cand("x", *rounds), "throughput", 16)
    assert stop_rounds(v, len(rounds), rivals, done, planned) == want


@given(st.dictionaries(names, st.tuples(st.lists(scores, min_size=1, max_size=3),
                                         st.integers(min_value=0, max_value=10)), min_size=1))
def test_under_an_slo_the_winner_meets_it_and_has_the_best_mean_of_those_that_do(
    by_name: dict[str, tuple[list[float], int]]
) -> None:
    """Each candidate: its rounds' throughputs and how many of its 10-request rounds' requests
    have a slow first token (the same in every round)."""
    slo = Slo(ttft_ms=500)
    ms = [cand(k, *(rnd(x, slow=slow) for x in xs)) for k, (xs, slow) in by_name.items()]
    verdicts = [judge(m, "slo", 16, slo) for m in ms]
    meeting = [v for v in verdicts if v.meets_slo]
    assert all(v.meets_slo == (by_name[v.name][1] <= 1) for v in verdicts)  # 90% of 10
    if not meeting:
        with pytest.raises(LauncherError, match="no candidate met TTFT ≤ 500 ms"):
            choose(verdicts, "slo", slo)
        return
    best = choose(verdicts, "slo", slo)
    assert best.meets_slo
    assert best.interval is not None
    assert best.interval.mean == max(v.interval.mean for v in meeting if v.interval)


@pytest.mark.parametrize(("slow", "done", "planned", "stops"), [
    (5, 1, 3, True),  # 5/10 within; even 20 more all within: 25/30 < 90%
    (2, 1, 3, False),  # 8/10 within; 28/30 = 93% still reachable
    (5, 3, 3, False),  # last round: nothing to save
])
def test_a_start_stops_when_its_slo_share_can_no_longer_be_reached(
    slow: int, done: int, planned: int, stops: bool
) -> None:
    v = judge(cand("x", rnd(100, slow=slow)), "slo", 16, Slo(ttft_ms=500))
    why = stop_rounds(v, 1, {}, done, planned)
    assert (why is not None) is stops
    if stops:
        assert why == ("stopped after 1 round(s): 5 of 10 requests within the SLO, it can no "
                       "longer reach 90%")
