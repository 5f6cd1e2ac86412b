"""benchmarks/gpu/host_speed.py's duty-cycle and per-CPU sweep and its reader,
benchmarks/gpu/host_speed_read.py (issue 22: the host's pace by duty cycle): the reader's parser
keeps every row and drops only what is not one, whatever the file holds; the sweep's arithmetic
(a duty's gap, a burst's first run against its later ones); a run of the sampler writes the older
fields beside the sweep's and sweeps only when asked (at start, or on a new matching line); the
reference's parts timed alone on each CPU (--parts-share) do the reference's work between them,
show in every per-CPU and pinned entry unless turned off, and the reader tells a part the slow
level slows from one it leaves alone."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.probe.hostcost import reference_work
from tests.support.scripts import REPO, load_script

HS = load_script("benchmarks/gpu/host_speed.py", "host_speed_benchmark")
RD = load_script("benchmarks/gpu/host_speed_read.py", "host_speed_read_benchmark")

OLD_FIELDS = {"t", "ref_cpu_ms", "ref_wall_ms"}

pos = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)
share = st.floats(0, 1)
duty_st = st.fixed_dictionaries(
    {"duty": st.floats(min_value=1, max_value=100), "med_ms": pos},
    optional={"p90_ms": pos, "mean_ms": pos, "first_med_ms": pos, "rest_med_ms": pos,
              "fast_share": share})
part_st = st.one_of(st.fixed_dictionaries({}, optional={"min_ms": pos, "med_ms": pos}),
                    st.just("x"), st.just({"min_ms": -1.0, "med_ms": 0.0}))
parts_st = st.fixed_dictionaries(
    {}, optional={"runs": st.integers(0, 100), "json": part_st, "pickle": part_st,
                  "sha256": part_st, "loop": part_st})
cpu_st = st.fixed_dictionaries({"cpu": st.integers(0, 255), "med_ms": pos},
                               optional={"fast_share": share, "parts": parts_st})
thread_st = st.fixed_dictionaries(
    {"pid": st.integers(1, 10**6), "tid": st.integers(1, 10**6), "cpu": st.integers(0, 7),
     "cpu_s": pos}, optional={"name": st.text(max_size=15)})
pinned_st = st.fixed_dictionaries({"cpu": st.integers(0, 7), "min_ms": pos},
                                  optional={"runs": st.integers(1, 100), "med_ms": pos,
                                            "parts": parts_st})
row_st = st.fixed_dictionaries(
    {"t": st.floats(min_value=0, max_value=2e9), "ref_cpu_ms": pos, "ref_wall_ms": pos},
    optional={"busy_first_ms": pos, "busy_mean_ms": pos, "busy_min_ms": pos,
              "busy_slow_share": share, "busy_runs": st.integers(1, 5000),
              "sweep": st.text(max_size=8), "duty": st.lists(duty_st, max_size=6),
              "per_cpu": st.lists(cpu_st, max_size=6),
              "threads": st.lists(thread_st, max_size=4),
              "pinned": st.lists(pinned_st, max_size=3)})
# what str.splitlines breaks a line at
BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
junk_st = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=BREAKS),
            min_size=1).filter(lambda s: s.strip() and not s.strip().startswith("{")),
    st.just('{"t": 1, "ref_cpu_ms": 0.5'),          # a line cut by a killed sampler
    st.just('{"t": 1, "ref_cpu_ms": "0.5"}'),        # no number
    st.just('{"t": 1, "ref_cpu_ms": -1}'),
    st.just("[1, 2]"))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(row_st.map(lambda r: ("row", r)), junk_st.map(lambda j: ("junk", j))),
                max_size=30))
def test_parser_keeps_every_row_and_counts_the_rest(items: list[tuple[str, object]]) -> None:
    text = "\n".join(json.dumps(x) if kind == "row" else str(x) for kind, x in items)
    rows, bad = RD.parse(text)
    assert rows == [x for kind, x in items if kind == "row"]
    assert bad == sum(kind == "junk" for kind, _ in items)
    if rows:   # and every summary of what it kept runs, with shares in [0, 1]
        lv = RD.levels(rows)
        assert 0 <= lv["slow_share"] <= 1
        assert lv["fast_ms"] <= lv["med_ms"]
        assert "\n".join(RD.report("f", rows, bad))
    for r in rows:  # each duty paced against the highest one's median; CPUs spread from 1 up
        table = RD.duty_table(r)
        assert [d["duty"] for d in table] == sorted(d["duty"] for d in r.get("duty", []))
        if table:
            assert table[-1]["rel"] == 1.0
        c = RD.cpu_spread(r)
        assert c is None or c["spread"] >= 1.0
        assert_part_spread(RD.part_spread(r.get("per_cpu"), "med_ms"))
    assert_part_spread(RD.part_spread([p for r in rows for p in r.get("pinned", [])], "min_ms"))
    e = RD.engine_cpus(rows)
    assert (e is None) == (not any(r.get("threads") for r in rows))
    if e is not None and "pinned_n" in e:
        assert 0 <= e["pinned_fast"] <= 1
        assert 0 <= e["sampler_fast"] <= 1


def assert_part_spread(p: dict[str, object] | None) -> None:
    """A part_spread's figures, whatever entries it read: spreads from 1 up, ratios positive,
    correlations in [-1, 1], the reference's own ratio as its entries split."""
    if p is None:
        return
    assert "ref" in p
    for name in ("ref", *RD.PARTS):
        g = p.get(name)
        if g is None:
            continue
        assert isinstance(g, dict)
        assert g["spread"] >= 1.0
        assert g["min_ms"] <= g["max_ms"]
        assert g.get("slow_over_fast", 1.0) > 0
        assert -1 - 1e-9 <= g.get("corr", 0.0) <= 1 + 1e-9
    ref = p["ref"]
    assert isinstance(ref, dict)
    assert 0 <= int(str(p["slow_n"])) <= ref["n"]


@given(st.floats(min_value=0.01, max_value=1.0), st.floats(min_value=1e-4, max_value=0.05))
def test_a_duty_gap_makes_the_thread_busy_that_share(duty: float, burst: float) -> None:
    gap = HS.gap_s(duty, burst)
    assert gap >= 0
    assert burst / (burst + gap) == pytest.approx(duty, rel=1e-9)


def test_a_burst_that_starts_fast_shows_as_first_below_rest() -> None:
    burst_lists = [[0.0005, 0.001, 0.001], [0.0005, 0.001]] * 5
    d = HS.duty_stats(25.0, burst_lists, [0.001] * 25, 0.003, low=0.0005)
    assert d["fast_share"] == 0.4   # 10 of 25 runs under 1.4 x the sweep's fastest
    assert d["first_med_ms"] == 0.5
    assert d["rest_med_ms"] == 1.0
    assert d["runs"] == 25
    assert d["bursts"] == 10
    assert d["gap_ms"] == 9.0


def test_duty_table_paces_each_duty_against_the_highest() -> None:
    row = {"duty": [{"duty": 100.0, "med_ms": 1.0}, {"duty": 10.0, "med_ms": 0.5},
                    {"duty": 50.0, "med_ms": 0.8}, {"duty": "x"}]}
    assert [(d["duty"], d["rel"]) for d in RD.duty_table(row)] == [(10.0, 0.5), (50.0, 0.8),
                                                                  (100.0, 1.0)]


def test_cpu_spread_names_the_slow_cpus() -> None:
    row = {"per_cpu": [{"cpu": 0, "med_ms": 0.5}, {"cpu": 1, "med_ms": 0.95},
                       {"cpu": 2, "med_ms": 0.55}]}
    c = RD.cpu_spread(row)
    assert c is not None
    assert c["slow_cpus"] == [1]
    assert c["spread"] == pytest.approx(1.9)


def window(first: float, mean: float, low: float) -> dict[str, float]:
    return {"ref_cpu_ms": mean, "busy_first_ms": first, "busy_mean_ms": mean, "busy_min_ms": low}


def test_windows_tell_a_burst_then_slow_host_from_a_steady_one() -> None:
    # starts at the fast level (0.5) after idling, then runs mostly slow (mean 0.9)
    burst_then_slow = [window(0.5, 0.9, 0.5) for _ in range(20)] + [window(0.5, 0.5, 0.5)]
    w = RD.windows(burst_then_slow)
    assert w is not None
    assert w["mixed_first_fast"] == 1.0
    assert w["first_over_mean"] < 0.6
    steady = [window(0.35, 0.35, 0.34) for _ in range(20)]
    s = RD.windows(steady)
    assert s is not None
    assert s["mixed"] == 0
    assert s["first_fast"] == 1.0
    assert RD.windows([{"ref_cpu_ms": 0.4}]) is None


def test_line_watch_counts_only_new_matching_lines(tmp_path: Path) -> None:
    f = tmp_path / "summary.txt"
    f.write_text("a: ready=1 after 3s\n")
    w = HS.LineWatch(str(f), "ready=1")
    assert w.new() == []
    f.write_text(f.read_text() + "b: loadgen failed\nb: ready=1 after 9s\n")
    assert w.new() == ["b: ready=1 after 9s"]
    assert w.new() == []
    assert HS.LineWatch(str(tmp_path / "none"), "ready=1").new() == []


def run_sampler(*args: str) -> list[dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu/host_speed.py"), *args],
                         capture_output=True, text=True, timeout=60, env=env, check=True).stdout
    return [json.loads(x) for x in out.splitlines()]


def test_a_sweep_row_keeps_the_older_fields_and_covers_each_duty_and_cpu() -> None:
    (row,) = run_sampler("--samples", "1", "--duty", "50,100", "--duty-seconds", "0.04",
                         "--per-cpu", "0.01", "--sweep-at-start", "--tag", "before")
    assert row.keys() >= OLD_FIELDS
    assert row["sweep"] == "before"
    duty = row["duty"]
    assert isinstance(duty, list)
    assert [d["duty"] for d in duty] == [50.0, 100.0]
    assert all(d["runs"] >= 2 and d["min_ms"] <= d["med_ms"] <= d["p90_ms"] for d in duty)
    cpus = row["per_cpu"]
    assert isinstance(cpus, list)
    assert sorted(c["cpu"] for c in cpus) == sorted(os.sched_getaffinity(0))


def test_the_per_cpu_pass_puts_the_threads_affinity_back() -> None:
    before = os.sched_getaffinity(0)
    cpus = HS.per_cpu(0.001)
    assert [c["cpu"] for c in cpus] == sorted(before)
    assert os.sched_getaffinity(0) == before


def test_no_sweep_unless_asked() -> None:
    rows = run_sampler("--samples", "2", "--interval", "0", "--duty", "100",
                       "--duty-seconds", "0.02")
    assert len(rows) == 2
    assert all("sweep" not in r and r.keys() >= OLD_FIELDS for r in rows)


def test_duties_outside_a_percent_are_refused() -> None:
    assert HS.duties("10, 25,100") == [10.0, 25.0, 100.0]
    assert HS.duties("") == []
    for bad in ("0", "150", "-5"):
        with pytest.raises(argparse.ArgumentTypeError, match="percent"):
            HS.duties(bad)


def test_the_busy_window_runs_after_every_nth_sample_only() -> None:
    """--busy-every N: the sampler every second keeps the busy thread's share of the host it
    had beside a 5 s one (issue22-table.sh: --interval 1 --busy-every 5); the rows between keep
    the sleeping sampler's fields alone."""
    rows = run_sampler("--samples", "5", "--interval", "0", "--busy", "0.01", "--busy-every", "2")
    assert [("busy_mean_ms" in r) for r in rows] == [True, False, True, False, True]
    assert all(r.keys() >= OLD_FIELDS for r in rows)


def test_a_thread_stat_is_read_past_a_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    # /proc/PID/task/TID/stat: the name may hold ") (" and spaces; fields counted from the last ')'
    fields = ["S"] + [str(i) for i in range(4, 53)]   # field n holds str(n) from field 4 on
    fields[14 - 3], fields[15 - 3], fields[39 - 3] = "300", "100", "5"
    stat = tmp_path / "stat"
    stat.write_text("1234 (VLLM::Eng) (x y) " + " ".join(fields) + "\n")
    tick = os.sysconf("SC_CLK_TCK")
    assert HS._thread_stat(stat) == ("VLLM::Eng) (x y", 5, 400 / tick)
    stat.write_text("1234 (cut")
    assert HS._thread_stat(stat) is None
    assert HS._thread_stat(tmp_path / "gone") is None


@contextlib.contextmanager
def spinner(mark: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose one thread spins (an engine core's busy loop) and whose command line holds
    ``mark``, killed after the block."""
    spin = ("import threading, time\n"
            "def spin():\n    while True: pass\n"
            "threading.Thread(target=spin, daemon=True).start()\n"
            f"time.sleep(30)  # {mark}")
    p = subprocess.Popen([sys.executable, "-c", spin])
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def test_the_sampler_records_a_matching_processs_busy_thread_and_its_cpu() -> None:
    """--threads-match: a spinning thread of a process whose command line holds the text shows
    in the rows with the CPU it ran on, and --pin-ms times the reference on that CPU; a process
    that does not match, and this sampler itself, do not show."""
    with spinner("toposerve-spin-mark") as p:
        rows = run_sampler("--samples", "3", "--interval", "0.3",
                           "--threads-match", "toposerve-spin-mark", "--pin-ms", "5")
    busy = [t for r in rows[1:] for t in r["threads"]]  # type: ignore[attr-defined]
    assert busy
    assert {t["pid"] for t in busy} == {p.pid}
    allowed = os.sched_getaffinity(0)
    assert all(t["cpu"] in range(os.cpu_count() or 1) for t in busy)
    pinned = [x for r in rows[1:] for x in r.get("pinned", [])]  # type: ignore[attr-defined]
    assert pinned
    assert all(x["cpu"] in allowed and x["runs"] >= 1 for x in pinned)
    assert os.sched_getaffinity(0) == allowed


def test_engine_cpus_follows_the_busiest_thread_and_its_pinned_level() -> None:
    rows = [{"ref_cpu_ms": 0.9, "threads": [{"cpu": 3, "cpu_s": 0.9, "name": "VLLM::EngineCore"},
                                             {"cpu": 1, "cpu_s": 0.1}],
             "pinned": [{"cpu": 3, "min_ms": 0.5}, {"cpu": 1, "min_ms": 0.9}]},
            {"ref_cpu_ms": 0.5, "threads": [{"cpu": 3, "cpu_s": 0.8}], "pinned": [{"cpu": 3,
                                                                                  "min_ms": 0.5}]},
            {"ref_cpu_ms": 0.9, "threads": [{"cpu": 2, "cpu_s": 0.7}], "pinned": []}]
    e = RD.engine_cpus(rows)
    assert e is not None
    assert e["n"] == 3
    assert e["cpus"] == "3:2 2:1"
    assert e["name"] == "VLLM::EngineCore"
    assert e["pinned_n"] == 2
    assert e["pinned_fast"] == 1.0
    assert e["sampler_fast"] == 0.5                          # the sampler read slow in one
    assert RD.engine_cpus([{"ref_cpu_ms": 0.5}]) is None


def test_engine_cpus_follows_the_engine_core_over_a_busier_thread() -> None:
    """The API server's thread may be the busiest in a row (tokenising a burst); the engine core's
    CPU is the one whose level its steps run at."""
    rows = [{"ref_cpu_ms": 0.9, "threads": [{"cpu": 3, "cpu_s": 0.9, "name": "python3"},
                                             {"cpu": 5, "cpu_s": 0.4, "name": "VLLM::EngineCor"}],
             "pinned": [{"cpu": 3, "min_ms": 0.9}, {"cpu": 5, "min_ms": 0.5}]}]
    e = RD.engine_cpus(rows)
    assert e is not None
    assert e["cpus"] == "5:1"
    assert e["pinned_med_ms"] == 0.5


def cpu_entry(cpu: int, ref: float, json_ms: float, loop_ms: float) -> dict[str, object]:
    return {"cpu": cpu, "med_ms": ref, "parts": {
        "runs": 10, "json": {"min_ms": json_ms, "med_ms": json_ms},
        "pickle": {"min_ms": 0.12, "med_ms": ref * 0.3}, "sha256": {"min_ms": 0.09, "med_ms": 0.09},
        "loop": {"min_ms": loop_ms, "med_ms": loop_ms}}}


def test_part_spread_tells_a_part_the_slow_level_slows_from_one_it_leaves_alone() -> None:
    # two vCPUs at the slow level (reference 0.95 ms) and two fast (0.5): the JSON parse runs
    # 1.9x slower on the slow ones, the plain loop alike on all, sha256 constant
    entries = [cpu_entry(0, 0.50, 0.18, 0.13), cpu_entry(1, 0.95, 0.34, 0.13),
               cpu_entry(2, 0.52, 0.19, 0.13), cpu_entry(3, 0.96, 0.35, 0.14)]
    p = RD.part_spread(entries, "med_ms")
    assert p is not None
    assert p["slow_n"] == 2
    assert p["ref"]["slow_over_fast"] == pytest.approx(0.96 / 0.52)
    assert p["json"]["slow_over_fast"] == pytest.approx(0.35 / 0.19)
    assert p["json"]["corr"] > 0.99
    assert p["loop"]["slow_over_fast"] == pytest.approx(0.14 / 0.13)
    assert p["sha256"]["spread"] == 1.0
    assert "corr" not in p["sha256"]          # a constant part has no correlation
    assert p["pickle"]["slow_over_fast"] == pytest.approx(p["ref"]["slow_over_fast"])
    lines = RD.report("f", [{"ref_cpu_ms": 0.5, "sweep": "before", "per_cpu": entries}], 0)
    assert any("per CPU parts (2 CPUs with the reference slow" in ln and "json x1.94" in ln
               for ln in lines)
    # entries of older rows (no "parts") give nothing, and neither do parts without a figure
    assert RD.part_spread([{"cpu": 0, "med_ms": 0.5}], "med_ms") is None
    assert RD.part_spread([{"cpu": 0, "med_ms": 0.5, "parts": {"json": "x"}}], "med_ms") is None
    assert RD.part_spread("not a list", "med_ms") is None


def test_the_parts_together_do_the_references_work() -> None:
    """sha256 of part_pickle's pickles of part_json's ids is the reference's result: the parts
    time the reference's own work, not a look-alike that could drift from it."""
    ids = HS.part_json()
    assert ids == list(range(1000, 5000))
    assert HS.part_pickle() == [pickle.dumps(tuple(ids[i:i + 16])) for i in range(0, 4000, 16)]
    assert HS.part_sha256() == reference_work()
    assert HS.part_loop() == HS.LOOP_N + 128


def parts_ok(entry: dict[str, object]) -> bool:
    parts = entry["parts"]
    assert isinstance(parts, dict)
    return int(parts["runs"]) >= 1 and all(
        0 < parts[n]["min_ms"] <= parts[n]["med_ms"] for n in RD.PARTS)


def test_every_per_cpu_and_pinned_entry_times_the_parts_unless_turned_off() -> None:
    """A real sampler run: the per-CPU pass's entries and the pinned ones each carry the four
    parts beside their older fields; --parts-share 0 leaves every entry as before."""
    with spinner("toposerve-parts-mark"):
        args = ("--samples", "2", "--interval", "0.3", "--per-cpu", "0.01", "--sweep-at-start",
                "--threads-match", "toposerve-parts-mark", "--pin-ms", "4")
        rows = run_sampler(*args)
        off = run_sampler(*args, "--parts-share", "0")
    cpus = rows[0]["per_cpu"]
    assert isinstance(cpus, list)
    assert sorted(c["cpu"] for c in cpus) == sorted(os.sched_getaffinity(0))
    assert all(c.keys() >= {"cpu", "first_ms", "runs", "med_ms", "min_ms", "fast_share"}
               and parts_ok(c) for c in cpus)
    pins = [x for r in rows[1:] for x in r.get("pinned", [])]  # type: ignore[attr-defined]
    assert pins
    assert all(x.keys() >= {"cpu", "runs", "min_ms", "med_ms"} and parts_ok(x) for x in pins)
    assert all("parts" not in c for c in off[0]["per_cpu"])  # type: ignore[attr-defined]
    assert all("parts" not in x for r in off for x in r.get("pinned", []))  # type: ignore[attr-defined]


def test_a_negative_parts_share_is_refused() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    got = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu/host_speed.py"),
                          "--samples", "1", "--parts-share", "-1"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert got.returncode == 2
    assert "--parts-share" in got.stderr
