"""benchmarks/gpu/issue22_now.py, the replay of issue 22's tables: it plans each case on the
topology the machine's own plan read (NVML alone: no GEMM rates, graph-kernel cost or link
figures from `probe --measure`), and says field by field where a replay is not the machine's
plan. Issue 22: the thirteenth table's Qwen3-8B depth figures replayed 5-9% low because the
replay planned on the lead's saved reading with its measured 761 TFLOP/s, where the machine
planned on the H200's datasheet figures."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.probe.topology import topology_from_json
from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "benchmarks" / "gpu" / "results" / "2026-12-01-h200-lead" / "h200-probe.json"
T13 = REPO / "benchmarks" / "gpu" / "results" / "2026-12-04-h200-table13"
H100_T15 = REPO / "benchmarks" / "gpu" / "h100-table15-nvml.json"


NOW = load_script("benchmarks/gpu/issue22_now.py", "issue22_now_benchmark")


def test_the_replay_topology_has_no_measured_gpu_figures(tmp_path: Path) -> None:
    saved = topology_from_json(json.loads(H200.read_text()))
    assert saved.gpus[0].perf is not None  # the lead's reading carries 761 TFLOP/s
    topo = topology_from_json(json.loads(NOW.machine_topology(H200, tmp_path).read_text()))
    assert [g.perf for g in topo.gpus] == [None]
    assert not any("measured" in n for n in topo.notes)
    # everything NVML read stays: the card, its memory, its PCIe link, the driver
    assert [(g.name, g.memory_bytes, g.cc, g.pcie_gen_cur, g.pcie_width_cur) for g in topo.gpus] \
        == [(g.name, g.memory_bytes, g.cc, g.pcie_gen_cur, g.pcie_width_cur) for g in saved.gpus]
    assert (topo.driver, topo.cuda) == (saved.driver, saved.cuda)


def test_the_h100_tables_plans_read_its_own_card_at_the_scaled_utilisation() -> None:
    """Table 15 ran on a lent H100: issue22-table.sh asked each case for the H200's bytes
    (qwen15 0.3 of 143,771 MiB -> 0.53 of 81,559), so a replay on the H200's fraction of the
    H100 would plan a pool 44% smaller than the machine's plans had."""
    gpu = topology_from_json(json.loads(H100_T15.read_text())).gpus[0]
    assert (gpu.name, gpu.perf) == ("NVIDIA H100 80GB HBM3", None)
    mib = NOW.topology_gpu_mib(H100_T15)
    assert mib == 81559
    ref = NOW.util_ref_mib()
    assert ref == NOW.topology_gpu_mib(H200) == 143771
    assert NOW.scaled_util(0.3, ref, mib) == 0.53
    assert NOW.scaled_util(0.5, ref, mib) == 0.88  # moe30, as the script's comment says
    assert NOW.scaled_util(0.9, ref, mib) == 0.92  # capped, the weights' room kept
    assert NOW.scaled_util(0.3, ref, ref) == 0.3  # the H200's own tables as they ran


def test_a_kept_gpu_record_gives_the_replay_the_figures_the_machines_plans_read(
        tmp_path: Path) -> None:
    """Tables run since d0434d7: the probe kept each GPU's figures for the plans after it, so a
    replay given that record (--gpu-perf) plans the GPU with exactly them."""
    from launcher.probe import gpuperf

    perf = topology_from_json(json.loads(H200.read_text())).gpus[0].perf
    assert perf is not None
    key = gpuperf.GpuKey("NVIDIA H200", "580.159.04", "GPU-0")
    kept = tmp_path / "gpu-perf-qwen8b.json"
    kept.write_text(json.dumps(gpuperf.kept_to_json(
        gpuperf.KeptPerf(key, "2026-12-05 01:00 UTC", perf))))
    bare = NOW.machine_topology(H200, tmp_path)
    topo = topology_from_json(json.loads(
        NOW.with_kept_perf(bare, kept, tmp_path, "qwen8b").read_text()))
    assert [g.perf for g in topo.gpus] == [perf]
    kept.write_text(json.dumps({"format": 1}))
    with pytest.raises(SystemExit, match="has no GPU key"):
        NOW.with_kept_perf(bare, kept, tmp_path, "qwen8b")


def test_a_machine_plan_from_measured_gpu_figures_kept_them_for_its_replay() -> None:
    """What the replay's topology rests on: a saved plan printed out on the machine planned from
    measured figures (topoparse notes "planned from figures measured on it" for those) only
    where its table kept the record those figures came from (gpu-perf-CASE.json, which
    issue22_replay_all.sh gives back with --gpu-perf): tables 1-13 ran before `probe --measure`
    kept any (d0434d7), so none of theirs did; the fourteenth's all did."""
    outs = sorted((REPO / "benchmarks" / "gpu" / "results").glob("*-h200-table*/*/launcher.out"))
    assert len(outs) >= 50
    measured = [p for p in outs if "planned from figures measured" in p.read_text()]
    assert not [p for p in measured if not (p.parent.parent / f"gpu-perf-{p.parent.name}.json")
                .is_file()]
    assert not [p for p in measured if "-table1" in p.parent.parent.name
                and p.parent.parent.name[-2:] in {"10", "11", "12", "13"}]
    assert len(measured) >= 4
    assert "1× NVIDIA H200" in (T13 / "qwen8b" / "launcher.out").read_text()


def test_an_nvml_dump_is_planned_as_it_is(tmp_path: Path) -> None:
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"gpus": [{"index": 0, "name": "NVIDIA H200"}]}))
    assert NOW.machine_topology(dump, tmp_path) == dump


pairs = st.fixed_dictionaries({"a": st.just(0), "b": st.just(1), "nvlinks": st.integers(0, 18),
                               "measured": st.none() | st.fixed_dictionaries(
                                   {"bandwidth_gbs": st.floats(1, 900),
                                    "allreduce_gbs": st.floats(1, 900)})})


@settings(max_examples=40, deadline=None)
@given(measured=st.lists(st.booleans(), min_size=1, max_size=4), pair=st.none() | pairs,
       notes=st.lists(st.sampled_from(["measured 2026-12-01 09:07:05", "one GPU: no link to "
                                       "measure", "GPU0 measured: 1 TFLOP/s", "a user's note",
                                       "GPU1: planned from figures measured on it (x)"])))
def test_any_saved_reading_loses_exactly_what_probe_measure_added(
        tmp_path_factory: Any, measured: list[bool], pair: dict[str, Any] | None,
        notes: list[str]) -> None:
    base = json.loads(H200.read_text())
    data = copy.deepcopy(base)
    gpu = base["gpus"][0]
    data["gpus"] = [{**gpu, "index": i, **({} if m else {"measured": None})}
                    for i, m in enumerate(measured)]
    data["pairs"] = [pair] if pair and len(measured) > 1 else []
    data["notes"] = notes
    out = tmp_path_factory.mktemp("t")
    src = out / "in.json"
    src.write_text(json.dumps(data))
    bare = json.loads(NOW.machine_topology(src, out).read_text())
    topo, before = topology_from_json(bare), topology_from_json(data)
    assert all(g.perf is None for g in topo.gpus)
    assert all(p.measured is None for p in topo.pairs)
    assert list(bare["notes"]) == [n for n in notes if n == "a user's note"]
    strip = [{k: v for k, v in vars(g).items() if k != "perf"} for g in before.gpus]
    assert [{k: v for k, v in vars(g).items() if k != "perf"} for g in topo.gpus] == strip
    assert [p.nvlinks for p in topo.pairs] == [p.nvlinks for p in before.pairs]


def test_the_machines_own_plan_is_all_agreement() -> None:
    lines = [json.loads(x) for x in (T13 / "predictions-measured-qwen8b.jsonl").read_text()
             .splitlines()]
    assert NOW.disagreements(lines, copy.deepcopy(lines)) == []
    assert NOW.disagreements(lines, lines[:1]) == [f"qwen8b {s}: not replayed"
                                                   for s in ("c32", "depth8000", "depth32000")]


def test_a_replay_off_the_machine_names_the_leaf() -> None:
    """The thirteenth table's Qwen3-8B at 32k, as replayed on the measured rates."""
    machine = [json.loads(x) for x in (T13 / "predictions-measured-qwen8b.jsonl").read_text()
               .splitlines()][3:]
    replay = copy.deepcopy(machine)
    replay[0]["agent_rooms"][1]["ttft_recomputed_s"] = 1.2616229960155987
    del replay[0]["kernel_table"]
    del replay[0]["agent_rooms"][0]["host_copy_s"]
    assert NOW.disagreements(machine, replay) == [
        "qwen8b depth32000 kernel_table: true -> \"(none)\"",
        "qwen8b depth32000 agent_rooms[0].host_copy_s: 0.09361097003555102 -> \"(none)\"",
        "qwen8b depth32000 agent_rooms[1].ttft_recomputed_s: 1.3814906935203006 -> "
        "1.2616229960155987"]
    # a field an older predict did not write is no disagreement
    older = [{k: v for k, v in machine[0].items() if k != "compilation_config"}]
    assert NOW.disagreements(older, copy.deepcopy(machine)) == []


json_leaf = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=5) \
    | st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text("abc", min_size=1, max_size=3), inner,
                                            max_size=3), max_leaves=12)


@settings(max_examples=80, deadline=None)
@given(line=st.dictionaries(st.text("xyz", min_size=1, max_size=3), json_value, max_size=4),
       pick=st.integers(0, 100))
def test_one_changed_leaf_is_one_disagreement(line: dict[str, Any], pick: int) -> None:
    machine = {"case": "c", "scenario": "s", **line}
    assert NOW.disagreements([machine], [copy.deepcopy(machine)]) == []
    paths = list(NOW.leaves(machine))
    path = paths[pick % len(paths)]
    if path in ("case", "scenario"):
        return
    replay = json.loads(json.dumps(machine))
    # walk to the leaf and put a value no JSON leaf above equals
    keys = [int(k[:-1]) if k.endswith("]") else k
            for k in path.replace("[", ".").split(".") if k]
    at: Any = replay
    for k in keys[:-1]:
        at = at[k]
    at[keys[-1]] = "changed leaf"
    assert [d.split(":")[0] for d in NOW.disagreements([machine], [replay])] == [f"c s {path}"]


names = st.sampled_from(["CUDA_VISIBLE_DEVICES", "NCCL_P2P_DISABLE", "TOPOSERVE_HOST_FREE_GIB",
                         "TOPOSERVE_CACHE", "XDG_CACHE_HOME", "PATH", "PYTHONPATH", "HOME"])


@given(env=st.dictionaries(names | st.text("ABC_", min_size=1, max_size=4), st.text(max_size=4)))
def test_a_replayed_plan_reads_nothing_of_this_host(env: dict[str, str]) -> None:
    """No GPU narrowing, NCCL transport, free host memory or cache of this host: the cache is
    the replay's own (a `probe --measure` here keeps this host's front-end timing in
    ~/.cache/toposerve, which a plan would take for the serving host's)."""
    got = NOW.plan_env(env, Path("/replay/cache"))
    assert got["TOPOSERVE_CACHE"] == "/replay/cache"
    # the GPU engine's vLLM is the one the tables ran, not this host's installed build
    assert got["TOPOSERVE_VLLM_VERSION"] == NOW.TABLES_VLLM == "0.26.0"
    assert not set(got) & set(NOW.PLAN_ENV_DROPPED)
    set_here = (*NOW.PLAN_ENV_DROPPED, "TOPOSERVE_CACHE", "TOPOSERVE_VLLM_VERSION")
    assert {k: v for k, v in env.items() if k not in set_here} \
        == {k: v for k, v in got.items() if k not in set_here}


T6 = REPO / "benchmarks" / "gpu" / "results" / "2026-12-03-h200-table6"


def _record(tmp_path: Path, config: dict[str, Any]) -> Path:
    (tmp_path / "case").mkdir()
    (tmp_path / "case" / "c32.json").write_text(json.dumps({"config": config}))
    return tmp_path


def test_table_6s_32_streams_are_replayed_at_the_64_requests_it_measured() -> None:
    """Helper 130: tables 5 and 6 measured 64 requests at 32 streams (2 a stream, after 32
    warm-up), where the planner's simulation sends loadgen's default of 4 a stream; a replay at
    128 scored their TTFT against a run they did not make."""
    load = NOW.recorded_load(T6, "qwen17", "c32")
    assert load == NOW.RecordedLoad(requests=64, warmup=32, concurrency=32)
    per, said = NOW.requests_per_stream(load, "c32")
    assert per == 2
    assert "64 measured requests" in said
    cmd = NOW.plan_command(per)
    assert cmd[cmd.index(NOW.PLAN_AT) + 1:][:2] == ["2", "plan"]


def test_a_record_with_64_requests_is_simulated_with_64(tmp_path: Path) -> None:
    """The count reaches the planner's own simulation: the replayed plan's load_requests and
    its line say 64, not the default's 128."""
    results = _record(tmp_path, {"requests": 64, "warmup": 32, "concurrency": 32})
    per, _ = NOW.requests_per_stream(NOW.recorded_load(results, "case", "c32"), "c32")
    line = json.loads(NOW.plan_line("case", "c32", "qwen3-1.7b-shape", 0.3,
                                    NOW.machine_topology(H200, tmp_path), None,
                                    NOW.RUNS_COMPILATION, tmp_path / "cache", per))
    assert line.get("load_requests") == 64, line


def test_a_record_without_a_count_is_planned_as_today(tmp_path: Path) -> None:
    results = _record(tmp_path, {"requests": None, "warmup": None, "concurrency": 32})
    per, said = NOW.requests_per_stream(NOW.recorded_load(results, "case", "c32"), "c32")
    assert per is None
    assert "planned as today" in said
    assert NOW.plan_command(None)[1:] == ["-m", "launcher", "plan"]
    # no record at all (the depth scenarios are saved under other names): the same
    assert NOW.requests_per_stream(NOW.recorded_load(results, "case", "single"), "single")[0] \
        is None


@pytest.mark.parametrize("config", [{"requests": 50, "concurrency": 32},
                                    {"requests": 64, "concurrency": 16}])
def test_a_count_the_simulation_cannot_send_is_refused(tmp_path: Path,
                                                       config: dict[str, Any]) -> None:
    """Uneven streams or another concurrency than the scenario's: refused, not rounded."""
    load = NOW.recorded_load(_record(tmp_path, config), "case", "c32")
    with pytest.raises(SystemExit):
        NOW.requests_per_stream(load, "c32")
