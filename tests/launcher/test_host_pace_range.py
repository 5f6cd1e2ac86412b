"""Where a plan's host timing ran its rounds at another pace than a running thread kept after
them (HostTiming.pace apart from 1 by more than hostcost.UNSTEADY), an engine may keep another,
and which is not known before the run: the plan predicts the chosen layout again with the
host's terms at the fastest and the slowest pace the host was seen at before the run
(HostTiming.pace_ends: the least of the sampled fastest tenth and the rounds, the greater of the
rounds and the sampled pace) and gives each figure that moves as its span over the planned and
those (``predicted.host_pace_range``), its planned figures unchanged. Issue 22's fourteenth
table: Qwen2.5-1.5B planned at pace 1.51 came out between that plan and the same plan at pace
1 (a copy of its record with the sampled pace equal to the rounds') on prefill, decode,
32-stream tok/s and TTFT p50; the fifteenth's, its rounds in a slow spell, ran at the host's fast
level, below both the rounds and the planned pace (benchmarks/gpu/host-pace-t15.md)."""

from __future__ import annotations

import json
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.engine.planfile import plan_from_json, plan_to_json
from launcher.engine.render import render
from launcher.model.modelspec import ModelSpec, load_model_spec
from launcher.pipeline import hostcosts
from launcher.pipeline.run import plan
from launcher.planner import loadsim
from launcher.planner.costmodel import Prediction
from launcher.planner.plantypes import Plan, Policy
from launcher.probe import hostcost, kernels
from launcher.probe.hostcost import HostTiming
from launcher.probe.topology import Topology, load_topology
from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
T14 = REPO / "benchmarks" / "gpu" / "results" / "2026-12-05-h200-table14"
H200 = REPO / "benchmarks" / "gpu" / "results" / "2026-12-01-h200-lead" / "h200-probe.json"
LINE = "host pace: the host's work planned at x"
load_script("benchmarks/gpu/aic_compare.py", "aic_compare")  # what the table script imports
TABLE = load_script("benchmarks/gpu/issue22_table.py", "issue22_table_pace")


def qwen15(tmp_path: Path) -> tuple[ModelSpec, kernels.KernelTable, Topology]:
    """Table 14's qwen15 case as its machine planned it: the kernel table timed there, the
    H200 as NVML read it, and the case's host record (pace 1.51: rounds 0.57 ms, sampled
    0.86 ms)."""
    m = load_model_spec(str(REPO / "benchmarks" / "gpu" / "models" / "qwen2.5-1.5b-shape"))
    with tarfile.open(T14 / "kernels.tgz") as tar:
        raw = [json.load(f) for mem in tar.getmembers() if mem.name.endswith(".json")
               if (f := tar.extractfile(mem)) is not None]
    table = next(t for t in map(kernels.table_from_json, raw) if t.shape.name == m.name)
    h200 = json.loads(H200.read_text())
    del h200["gpus"][0]["measured"]
    (tmp_path / "h200.json").write_text(json.dumps(h200))
    topo = replace(load_topology(str(tmp_path / "h200.json"), {}),
                   host_timing=hostcosts.read(str(T14 / "host-cost-qwen15.json")))
    return m, table, topo


def at_pace(timing: HostTiming | None, pace: float) -> HostTiming:
    """``timing`` with its sustained samples at ``pace`` x its rounds' reference."""
    assert timing is not None
    assert timing.steadiness is not None
    st_ = timing.steadiness
    return replace(timing, steadiness=replace(st_, sustained_s=st_.reference_s * pace))


def c32(m: ModelSpec, table: kernels.KernelTable, topo: Topology) -> Plan:
    return plan(topo, m, Policy(force_tp=1, force_pp=1, force_dp=1, gpu_memory_utilization=0.3,
                                prompt_tokens=512, gen_tokens=256, concurrency=32,
                                kernels=(table,)))


def test_an_unsteady_pace_gives_spans_from_the_planned_figures_to_the_fast_end_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m, table, topo = qwen15(tmp_path)
    assert topo.host_timing is not None
    assert topo.host_timing.pace() == pytest.approx(1.508, abs=1e-3)
    p = c32(m, table, topo)
    # the same plan at the fast end (its fastest tenth, x0.974 the rounds'), a pace steady
    # enough to give no span; the slow end is the planned pace
    fast, slow = topo.host_timing.pace_ends()
    assert fast == pytest.approx(0.974, abs=1e-3)
    assert slow == topo.host_timing.pace()
    rounds = c32(m, table, replace(topo, host_timing=at_pace(topo.host_timing, fast)))
    assert not rounds.host_pace_range
    # and the plan without the span: its figures and its other lines are the plan's
    monkeypatch.setattr(loadsim, "host_pace_span", lambda *a: ({}, ()))
    bare = c32(m, table, topo)
    assert p.predicted == bare.predicted
    assert [r for r in p.reasons if not r.startswith(LINE)] == list(bare.reasons)
    assert p.candidates == bare.candidates
    span = p.host_pace_range
    for name in ("prefill_tok_s", "decode_tok_s", "throughput_tok_s", "ttft_p50_s",
                 "tpot_p50_s", "sim_throughput_tok_s"):
        planned, other = getattr(p.predicted, name), getattr(rounds.predicted, name)
        assert span[name] == (round(min(planned, other), 4), round(max(planned, other), 4))
        assert other != pytest.approx(planned, rel=0.2)  # host-bound: they move a lot
    # tok/s the planned figure is the low end, times the high end
    assert span["throughput_tok_s"][0] == round(p.predicted.throughput_tok_s, 4)
    assert span["ttft_p50_s"][1] == round(p.predicted.ttft_p50_s, 4)
    # what the engine measured lies inside (table 14: 8,246 tok/s, 0.131 s)
    assert span["throughput_tok_s"][0] <= 8246 <= span["throughput_tok_s"][1]
    assert span["ttft_p50_s"][0] <= 0.131 <= span["ttft_p50_s"][1]
    line = next(r for r in p.reasons if r.startswith(LINE))
    assert line.startswith(f"{LINE}1.51 its timed rounds'")
    assert "(x0.97, the least of the sampled fastest tenth and the rounds)" in line
    assert f"throughput {p.predicted.throughput_tok_s:,.0f} → " \
           f"{rounds.predicted.throughput_tok_s:,.0f} / " \
           f"{p.predicted.throughput_tok_s:,.0f} tok/s" in line
    d = json.loads(json.dumps(plan_to_json(p, render(p, "m", served_name=None, host="h",
                                                     port=1))))
    assert d["predicted"]["host_pace_range"] == {k: [lo, hi] for k, (lo, hi) in span.items()}
    assert d["predicted"]["throughput_tok_s"] == round(p.predicted.throughput_tok_s, 4)
    # a saved plan reads back with its planned figures (the span is the plan's word)
    assert plan_from_json(d).predicted.throughput_tok_s == pytest.approx(
        p.predicted.throughput_tok_s, abs=1e-4)


@pytest.mark.parametrize("pace", [1.0, 1.05, 1 / 1.05, hostcost.UNSTEADY - 0.01])
def test_a_steady_pace_gives_no_span(tmp_path: Path, pace: float) -> None:
    m, table, topo = qwen15(tmp_path)
    p = c32(m, table, replace(topo, host_timing=at_pace(topo.host_timing, pace)))
    assert not p.host_pace_range
    assert not any(r.startswith(LINE) for r in p.reasons)
    d = plan_to_json(p, render(p, "m", served_name=None, host="h", port=1))
    assert "host_pace_range" not in d["predicted"]


def test_rounds_in_a_slow_spell_give_a_span_on_both_sides_of_the_planned_figures(
        tmp_path: Path) -> None:
    """Rounds in a slow spell (pace below 1, table 15's x0.7255): the rounds' speed is the slow
    end and the sampled fastest tenth (x0.468 the rounds' here) the fast one, so each figure's
    span reaches past its planned figure both ways (before, the planned figure was its fast end,
    and table 15's engine ran faster still)."""
    m, table, topo = qwen15(tmp_path)
    timing = at_pace(topo.host_timing, 0.7255)
    p = c32(m, table, replace(topo, host_timing=timing))
    fast, slow = timing.pace_ends()
    assert fast == pytest.approx(0.7255 / 1.549, abs=1e-3)
    assert slow == 1.0
    at_fast, at_slow = (c32(m, table, replace(topo, host_timing=at_pace(timing, end)))
                        for end in (fast, slow))
    # 32 streams' rate and first tokens move both ways; one stream's decode and the TPOT reach
    # the GPU's own step at the fast end (table 15's single-stream TPOT ran at it)
    for name, faster, both in (("throughput_tok_s", max, True), ("ttft_p50_s", min, True),
                               ("tpot_p50_s", min, False), ("decode_tok_s", max, False)):
        planned = round(getattr(p.predicted, name), 4)
        lo, hi = p.host_pace_range[name]
        assert lo < planned < hi if both else lo <= planned <= hi and lo < hi, name
        ends = (getattr(at_fast.predicted, name), getattr(at_slow.predicted, name))
        assert (lo, hi) == (round(min(ends), 4), round(max(ends), 4)), name
        assert round(faster(ends), 4) == (hi if faster is max else lo), name
    line = next(r for r in p.reasons if r.startswith(LINE))
    assert f"(as planned → at x{fast:.2f} / at x1.00)" in line


FIGS = st.floats(min_value=1e-4, max_value=1e6, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(FIGS, min_size=5, max_size=5), st.lists(FIGS, min_size=5, max_size=5))
def test_a_span_holds_both_figures_and_only_figures_that_move(a: list[float],
                                                              b: list[float]) -> None:
    planned, other = Prediction(*a, batch=1), Prediction(*b, batch=1)
    span = loadsim.pace_span(planned, other)
    for name in Prediction.__dataclass_fields__:
        if name == "batch":
            continue
        x, y = round(getattr(planned, name), 4), round(getattr(other, name), 4)
        if x == y:
            assert name not in span
        else:
            assert span[name] == (min(x, y), max(x, y))
    # with a third prediction, the span is over all three
    third = Prediction(*(x * 2 for x in a), batch=1)
    wide = loadsim.pace_span(planned, other, third)
    for name, (lo, hi) in wide.items():
        got = [round(getattr(q, name), 4) for q in (planned, other, third)]
        assert (lo, hi) == (min(got), max(got))


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4)
                       | st.floats(allow_nan=True, allow_infinity=True),
                       lambda kids: st.lists(kids, max_size=3)
                       | st.dictionaries(st.text(max_size=16), kids, max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(JSONISH, st.sampled_from(["throughput_tok_s", "ttft_p50_s"]))
def test_the_table_reads_a_span_or_nothing_from_any_line(value: object, key: str) -> None:
    for line in (value, {"host_pace_range": value}, {"host_pace_range": {key: value}}):
        got = TABLE.pace_range(line, key)
        assert got is None or (len(got) == 2 and got[0] <= got[1])
    assert TABLE.pace_range({"host_pace_range": {key: [1, 2.5]}}, key) == (1.0, 2.5)
    assert TABLE.pace_range({"host_pace_range": {key: [2.5, 1]}}, key) is None


def test_the_table_says_which_measured_figures_lie_outside_their_span() -> None:
    figs = [TABLE.Figure("qwen15", "decode tok/s", 378.0, 298.0, None, (298.0, 449.0)),
            TABLE.Figure("qwen15", "16k output tok/s, 1 at once", 315.0, 226.0, None,
                         (226.0, 310.0)),
            TABLE.Figure("qwen8b", "decode tok/s", 140.0, 139.0, None, None)]
    line = TABLE.pace_summary(figs)
    assert line.startswith("host-pace range: 1 of 2 measured figures inside")
    assert "outside: qwen15 16k output tok/s, 1 at once 315 not in 226-310 (+1.6% past)" in line
    assert TABLE.pace_summary(figs[2:]) is None
