"""Topology input the project has never seen: real dumps with any field, list or element deleted,
nulled, retyped or made an ``ERR:`` string at any depth, and dumps generated from nothing. Through
the command line, as a user runs it: `plan` and `probe` end in a plan (or a reading) whose notes
say what was unknown and what was assumed, or in one `launcher: error:` line; never a traceback.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.cli.main import main
from launcher.probe.topology import load_topology, topology_from_json, topology_to_json
from tests.launcher.paths import REPO, TOPOLOGIES, model

FIXTURES = {p.name: json.loads(p.read_text()) for p in sorted(TOPOLOGIES.glob("*.json"))}
MODEL = model("mistral-7b")  # small enough to fit anywhere: the plan, not a PlanError, is tested
ERR = "ERR:NVMLError_NotSupported"

# Any JSON value, small: what a broken file or a foreign tool could put anywhere.
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from([ERR, "ERR:", "ERR:NVMLError_NoPermission", "", "OK", "SYS", "nvlink"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON tree: dict keys and list positions, at every depth."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return
    for key, child in items:
        yield (*prefix, key)
        yield from paths(child, (*prefix, key))


def mutate(doc: Any, where: tuple[Any, ...], how: str, new: Any) -> None:
    parent = doc
    for key in where[:-1]:
        parent = parent[key]
    key = where[-1]
    if how == "delete":
        del parent[key]
    else:
        parent[key] = {"null": None, "err": ERR, "retype": new}[how]


@st.composite
def mutated_fixtures(draw: st.DrawFn) -> tuple[str, Any, list[str]]:
    name = draw(st.sampled_from(sorted(FIXTURES)))
    doc = copy.deepcopy(FIXTURES[name])
    done = []
    for _ in range(draw(st.integers(1, 4))):
        places = list(paths(doc))
        if not places:
            break
        where = draw(st.sampled_from(places))
        how = draw(st.sampled_from(["delete", "null", "err", "retype"]))
        mutate(doc, where, how, draw(JSON))
        done.append(f"{how} {'/'.join(map(str, where))}")
    return name, doc, done


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return value | JSON | st.just(ERR)


def _mostly(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Usually a good value: fields the planner needs, so that many cases get as far as a plan."""
    return st.one_of(value, value, value, JSON, st.just(ERR))


def _gpu(fields: dict[str, Any], memory: str) -> st.SearchStrategy[dict[str, Any]]:
    """A GPU entry that has its memory field (a good value, mostly) and any of the others."""
    rest = {k: v for k, v in fields.items() if k != memory}
    return st.fixed_dictionaries({memory: fields[memory]}, optional=rest)


@st.composite
def generated_dumps(draw: st.DrawFn) -> dict[str, Any]:
    """An NVML dump built from nothing: plausible values, junk, refusals and gaps, mixed."""
    n = draw(st.integers(0, 4))
    gpu_fields = {
        "index": _maybe(st.integers(0, 5)),
        "name": _maybe(st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 3090"])),
        "uuid": _maybe(st.text(max_size=8)),
        "bus_id": _maybe(st.sampled_from(["00000000:01:00.0", "0000:02:00.0", "zz:1"])),
        "memory_total": _mostly(st.sampled_from([24 << 30, 80 << 30, 0, -1])),
        "cc": _maybe(st.lists(st.integers(-1, 12), max_size=3)),
        "pcie_gen_cur": _maybe(st.integers(0, 6)),
        "pcie_gen_max": _maybe(st.integers(0, 6)),
        "pcie_width_cur": _maybe(st.sampled_from([1, 4, 8, 16, 0])),
        "pcie_width_max": _maybe(st.sampled_from([4, 16])),
        "numa_node": _maybe(st.integers(-1, 2)),
        "nvlinks": _maybe(
            st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "link": _maybe(st.integers(0, 17)),
                        "active": _maybe(st.integers(0, 1)),
                        "remote_bus": _maybe(st.sampled_from(["FFFFFFFF:FF:FF.0", "0000:02:00.0"])),
                    },
                ),
                max_size=4,
            )
        ),
    }
    pair_fields = {
        "a": _maybe(st.integers(0, 5)),
        "b": _maybe(st.integers(0, 5)),
        "common_ancestor": _maybe(st.sampled_from([0, 10, 20, 30, 40, 50, 7])),
        **{f: _maybe(st.integers(0, 7)) for f in ("p2p_read", "p2p_write", "p2p_nvlink")},
    }
    gpus = [draw(_gpu(gpu_fields, "memory_total")) | {"index": i} for i in range(n)]
    gpus += draw(st.lists(st.fixed_dictionaries({}, optional=gpu_fields) | JSON, max_size=2))
    dump: dict[str, Any] = {"gpus": gpus}
    if draw(st.booleans()):
        dump["pairs"] = draw(
            st.lists(st.fixed_dictionaries({}, optional=pair_fields) | JSON, max_size=6) | JSON
        )
    if draw(st.booleans()):
        dump["driver"], dump["cuda"] = draw(JSON), draw(JSON)
    return dump


@st.composite
def generated_saved_topologies(draw: st.DrawFn) -> dict[str, Any]:
    """The project's own format (probe --save) built from nothing, junk and gaps mixed in."""
    n = draw(st.integers(0, 4))
    names = st.sampled_from(["OK", "NOT_SUPPORTED", "CHIPSET_NOT_SUPPORTED", "UNKNOWN", "ok"])
    gpu_fields = {
        "index": _maybe(st.integers(0, 5)),
        "name": _maybe(st.sampled_from(["NVIDIA H200", "NVIDIA GeForce RTX 4090"])),
        "memory_bytes": _mostly(st.sampled_from([24 << 30, 141 << 30, 0, 1 << 60])),
        "cc": _maybe(st.lists(st.integers(-1, 12), max_size=3)),
        "pcie_gen_cur": _maybe(st.integers(0, 6)),
        "pcie_gen_max": _maybe(st.integers(0, 6)),
        "pcie_width_cur": _maybe(st.sampled_from([1, 4, 16, 0, 128])),
        "pcie_width_max": _maybe(st.sampled_from([4, 16])),
        "nvlinks_active": _maybe(st.integers(-1, 18)),
        "persistence_mode": _maybe(st.booleans()),
    }
    measured = st.fixed_dictionaries(
        {},
        optional={
            "bandwidth_gbs": _maybe(st.floats(-1, 500)),
            "allreduce_gbs": _maybe(st.floats(allow_nan=True)),
            "latency_us": _maybe(st.floats(0, 100)),
            "nccl_transport": _maybe(st.sampled_from(["nvlink", "shm", "p2p-pcie", "pigeon"])),
            "allreduce_ok": _maybe(st.booleans()),
        },
    )
    pair_fields = {
        "a": _maybe(st.integers(0, 5)),
        "b": _maybe(st.integers(0, 5)),
        "nvlinks": _maybe(st.sampled_from([0, 4, 18, -2])),
        "common_ancestor": _maybe(st.sampled_from(["PIX", "PHB", "SYS", "X", "nowhere"])),
        **{f: _maybe(names) for f in ("p2p_read", "p2p_write", "p2p_nvlink")},
        "measured": _maybe(measured),
    }
    gpus = [draw(_gpu(gpu_fields, "memory_bytes")) | {"index": i} for i in range(n)]
    gpus += draw(st.lists(st.fixed_dictionaries({}, optional=gpu_fields) | JSON, max_size=2))
    doc: dict[str, Any] = {"format": "toposerve-topology/1", "gpus": gpus}
    if draw(st.booleans()):
        doc["pairs"] = draw(
            st.lists(st.fixed_dictionaries({}, optional=pair_fields) | JSON, max_size=6) | JSON
        )
    if draw(st.booleans()):
        doc["notes"], doc["driver"], doc["cuda"] = draw(JSON), draw(JSON), draw(JSON)
    if draw(st.booleans()):
        doc["host_available_bytes"] = draw(st.integers(-1, 1 << 52) | JSON)
    return doc


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def assert_plans_or_one_line_error(doc: Any, context: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "topology.json"
        f.write_text(json.dumps(doc))
        code, out, err = run_cli("plan", "--topology", str(f), "--model", MODEL)
        if code == 0:
            assert "why:" in out, context
            assert "command:" in out, context
            assert err == "", context
        else:
            assert err.startswith("launcher: error: "), (context, err)
            assert err.count("\n") == 1, (context, err)
        # probe shows the same reading, and its saved JSON reads back as the same topology
        saved = Path(tmp) / "saved.json"
        pcode, _, perr = run_cli("probe", "--topology", str(f), "--save", str(saved))
        # plan's exit 3 is a PlanError (nothing fits): the reading itself was usable
        assert pcode == (1 if code == 1 else 0), (context, perr)
        if pcode == 0:
            first, again = load_topology(str(f), {}), load_topology(str(saved), {})
            assert (again.gpus, again.pairs) == (first.gpus, first.pairs), context


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutated_fixtures())
def test_a_real_dump_mutated_anywhere_plans_or_fails_in_one_line(
    case: tuple[str, Any, list[str]],
) -> None:
    name, doc, done = case
    assert_plans_or_one_line_error(doc, (name, done))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=generated_dumps())
def test_a_generated_dump_plans_or_fails_in_one_line(doc: dict[str, Any]) -> None:
    assert_plans_or_one_line_error(doc, doc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=generated_saved_topologies())
def test_a_generated_saved_topology_plans_or_fails_in_one_line(doc: dict[str, Any]) -> None:
    assert_plans_or_one_line_error(doc, doc)


@settings(max_examples=50, deadline=None)
@given(doc=JSON)
def test_any_json_at_all_plans_or_fails_in_one_line(doc: Any) -> None:
    assert_plans_or_one_line_error(doc, doc)


# ----------------------------------------------------------------- what the notes say, by case


def plan_reasons(doc: Any, tmp_path: Path) -> list[str]:
    f = tmp_path / "t.json"
    f.write_text(json.dumps(doc))
    code, out, err = run_cli("plan", "--topology", str(f), "--model", MODEL, "--json")
    assert code == 0, err
    reasons: list[str] = json.loads(out)["reasons"]
    return reasons


def h200(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(FIXTURES["h200x2-nvlink.nvml.json"])
    for g in doc["gpus"]:
        g.update(changes)
    return doc


def test_a_refused_nvlink_query_plans_without_nvlink_and_says_so(tmp_path: Path) -> None:
    # What GeForce cards without NVLink answer: the whole query refused (issue 15's traceback).
    reasons = plan_reasons(h200(nvlinks=ERR), tmp_path)
    assert any(
        r.startswith("GPU0, GPU1: NVLink state unknown (NVML refused: NVMLError_NotSupported)")
        and "assumed no NVLink" in r
        for r in reasons
    ), reasons
    assert not any("nvlink" in r and "chosen" in r for r in reasons)


def test_an_unknown_pcie_width_assumes_the_slow_case(tmp_path: Path) -> None:
    doc = h200(nvlinks=[], pcie_width_cur=None)
    wide = plan_reasons(h200(nvlinks=[]), tmp_path)
    narrow = plan_reasons(doc, tmp_path)
    assert any("PCIe link width unknown; assumed x4" in r for r in narrow), narrow
    assert not any("PCIe link width unknown" in r for r in wide)

    def assumed_gbs(reasons: list[str]) -> float:
        [line] = [r for r in reasons if r.startswith("GPU0-GPU1: ") and "GB/s assumed" in r]
        return float(line.split("~")[1].split(" GB/s")[0])

    assert assumed_gbs(narrow) < assumed_gbs(wide) / 3  # x4 instead of x16


def test_unknown_p2p_and_a_missing_pair_assume_host_memory(tmp_path: Path) -> None:
    doc = h200()
    doc["pairs"][0]["p2p_read"] = "ERR:NVMLError_Unknown"
    doc["pairs"][0]["p2p_nvlink"] = None  # the VM's links end on a hidden bus: not counted
    reasons = plan_reasons(doc, tmp_path)
    assert any("P2P status unknown; assumed no P2P" in r for r in reasons), reasons
    del doc["pairs"]
    reasons = plan_reasons(doc, tmp_path)
    assert any(r.startswith("GPU0-GPU1: no entry in 'pairs'; assumed no NVLink") for r in reasons)


def test_a_gpu_entry_that_is_no_gpu_is_left_out_with_a_note(tmp_path: Path) -> None:
    doc = h200()
    doc["gpus"][1] = "ERR:NVMLError_GpuIsLost"
    reasons = plan_reasons(doc, tmp_path)
    assert any(r.startswith("gpus[1]: not a GPU object") for r in reasons), reasons


@settings(max_examples=200, deadline=None)
@given(value=st.integers(-(1 << 60), 1 << 60) | JSON)
def test_the_saved_host_memory_is_read_back_or_noted_as_unknown(value: Any) -> None:
    doc = copy.deepcopy(FIXTURES["h200x2-measured.toposerve.json"])
    doc["host_available_bytes"] = value
    topo = topology_from_json(doc)
    if topo.host_available_bytes is None:
        # absent, NVML's refusal form (as for every field), or noted as unreadable
        assert value is None or str(value).startswith("ERR:") or any(
            n.startswith("host: host_available_bytes unknown") for n in topo.notes), topo.notes
    else:
        assert topo.host_available_bytes == value
        assert not isinstance(value, bool)
        assert topology_from_json(topology_to_json(topo)) == topo


def test_unreadable_values_in_our_own_format_are_named(tmp_path: Path) -> None:
    doc = copy.deepcopy(FIXTURES["h200x2-measured.toposerve.json"])
    doc["gpus"][0]["memory_bytes"] = "lots"
    doc["pairs"][0]["nvlinks"] = "ERR:NVMLError_NotSupported"
    doc["pairs"][0]["measured"] = None
    reasons = plan_reasons(doc, tmp_path)
    assert any("GPU0: memory_bytes unknown (unreadable value 'lots')" in r for r in reasons)
    assert any("GPU0: memory size unknown; assumed unusable" in r for r in reasons)
    assert any("GPU0-GPU1: NVLink count unknown (NVML refused" in r for r in reasons), reasons


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe{", "not JSON"),
        (b"[" * 100_000, "not JSON"),
        (b'{"gpus": {"0": {}}}', "'gpus' is unreadable value"),
        (b'{"gpus": [1, 2]}', "none of the 2 entries of 'gpus' is a usable GPU"),
        ((TOPOLOGIES / "h200x2-nvlink.topo-m.txt").read_bytes(),
         "is `nvidia-smi topo -m` output, which names neither the GPU models nor their memory; "
         "on that machine run `launcher probe --save FILE`"),
    ],
)
def test_files_with_nothing_usable_end_in_one_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    f = tmp_path / "t.json"
    f.write_bytes(content)
    code, _, err = run_cli("plan", "--topology", str(f), "--model", MODEL)
    assert code == 1
    assert err.startswith("launcher: error: "), err
    assert message in err, err
    assert err.count("\n") == 1, err


def test_a_refused_nvlink_query_through_a_real_process_prints_a_plan(tmp_path: Path) -> None:
    f = tmp_path / "geforce.json"
    f.write_text(json.dumps(h200(nvlinks=ERR)))
    res = subprocess.run(
        [sys.executable, "-m", "launcher", "plan", "--topology", str(f), "--model", MODEL],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert "NVLink state unknown" in res.stdout


def test_a_topology_path_that_is_no_readable_file_ends_in_one_line(tmp_path: Path) -> None:
    for path in (tmp_path, tmp_path / "missing.json"):
        code, _, err = run_cli("plan", "--topology", str(path), "--model", MODEL)
        assert code == 1
        assert err.startswith("launcher: error: "), err
        assert err.count("\n") == 1, err


_TOPO_M = (TOPOLOGIES / "h200x2-nvlink.topo-m.txt").read_bytes()


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=300)
       | st.builds(lambda cut, tail: _TOPO_M[:cut] + tail,
                   st.integers(0, len(_TOPO_M)), st.binary(max_size=40)))
def test_any_bytes_as_a_topology_file_plan_or_end_in_one_line(
        tmp_path: Path, content: bytes) -> None:
    # raw bytes, and `nvidia-smi topo -m` output cut anywhere and followed by anything
    f = tmp_path / "t.txt"
    f.write_bytes(content)
    code, _, err = run_cli("plan", "--topology", str(f), "--model", MODEL)
    assert code == 0 or (err.startswith("launcher: error: ") and err.count("\n") == 1), err
