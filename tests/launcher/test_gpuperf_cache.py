"""probe --measure times the GEMMs as vLLM runs an unquantized linear (F.linear on [n x k]
weights), and keeps each GPU's figures for later plans on this machine: the same GPU (name,
driver, UUID) planned from a live NVML reading reads them and says so, another GPU or driver
does not, a saved topology keeps its own, and a kept file that cannot be used leaves the
datasheet table with a reason line, never a traceback."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.cli import cmd_probe
from launcher.cli.main import main
from launcher.model.modelspec import load_model_spec
from launcher.pipeline import gpuperfs
from launcher.planner.plan import Policy, plan
from launcher.probe import gpuperf, measure, nvml
from launcher.probe.gpuperf import GpuPerf
from launcher.probe.topology import Gpu, Topology
from tests.launcher.fake_pynvml import FakeGpu, FakeNvml
from tests.launcher.paths import model

ADA = Gpu(0, "NVIDIA RTX 4000 Ada Generation", "GPU-ada-1", "00000000:01:00.0", 20 << 30,
          cc=(8, 9), pcie_gen_max=4, pcie_width_cur=16)
PERF = GpuPerf(prefill_tflops=88.0, decode_gbs=452.0, device=ADA.name,
               method="torch 2.13 bf16 F.linear as vLLM's unquantized linear, 18 shapes")
HERE = Topology(gpus=(ADA,), driver="550.120", source="nvml")
AT = "2026-12-05 01:00 UTC"


def test_the_gemm_timing_runs_f_linear_on_n_by_k_weights_as_vllm_does() -> None:
    torch = pytest.importorskip("torch")
    calls: list[tuple[tuple[int, ...], tuple[int, ...], bool]] = []

    def linear(x: Any, w: Any) -> Any:
        calls.append((tuple(x.shape), tuple(w.shape), bool(w.is_contiguous())))
        return torch.nn.functional.linear(x, w)

    def matmul(*_: Any) -> Any:
        raise AssertionError("torch.matmul on a [k x n] weight is not how vLLM runs a linear")

    spy = SimpleNamespace(randn=torch.randn, bfloat16=torch.bfloat16, matmul=matmul,
                          nn=SimpleNamespace(functional=SimpleNamespace(linear=linear)))
    shapes = [*gpuperf.prefill_shapes(32, tokens=8), *gpuperf.decode_shapes(32, (1, 2))]
    samples = measure.time_gemms(spy, "cpu", shapes, reps=2, cycle_bytes=1)
    assert [(s.kind, s.m, s.k, s.n) for s in samples] == shapes
    for _kind, m, k, n in shapes:  # x is [m x k], the weight [n x k] and contiguous
        assert ((m, k), (n, k), True) in calls
    assert {(x, w) for x, w, _ in calls} == {((m, k), (n, k)) for _, m, k, n in shapes}


def test_the_probe_line_says_what_was_timed() -> None:
    assert measure.TIMED_AS == "bf16 F.linear as vLLM's unquantized linear ([n x k] weights)"


def _kept(tmp_path: Path, topo: Topology = HERE) -> dict[str, str]:
    env = {"TOPOSERVE_CACHE": str(tmp_path)}
    measured = replace(topo, gpus=tuple(replace(g, perf=PERF) for g in topo.gpus))
    lines = gpuperfs.keep(measured, env, now=AT)
    assert len(lines) == len(topo.gpus)
    assert all("kept in" in line for line in lines)
    return env


def test_kept_figures_are_read_by_a_plan_of_the_same_gpu_and_move_its_prediction(
    tmp_path: Path,
) -> None:
    env = _kept(tmp_path)
    got = gpuperfs.attach(HERE, env)
    assert got.gpus[0].perf == PERF
    assert any(f"GPU0: planned from figures measured on it by probe --measure at {AT}" in n
               for n in got.notes)
    spec = load_model_spec(model("mistral-7b"))
    policy = Policy(workload="interactive", max_model_len=4096)
    table, measured = plan(HERE, spec, policy), plan(got, spec, policy)
    # decode bound by weight reads: 452 GB/s measured against the sm89 fallback's assumed rate
    assert measured.predicted.decode_tok_s > table.predicted.decode_tok_s * 1.5
    assert any("measured on it by probe --measure at" in r for r in measured.reasons)


@pytest.mark.parametrize("other", [
    replace(HERE, driver="560.35"),  # the same card under another driver
    replace(HERE, gpus=(replace(ADA, uuid="GPU-ada-2"),)),  # another card of the same model
    replace(HERE, gpus=(replace(ADA, name="NVIDIA RTX 4000 SFF Ada Generation"),)),
])
def test_another_gpu_or_driver_does_not_read_them(tmp_path: Path, other: Topology) -> None:
    env = _kept(tmp_path)
    assert gpuperfs.attach(other, env) == other
    assert gpuperfs.attach(other, env).notes == other.notes


def test_a_saved_topology_keeps_its_own_figures(tmp_path: Path) -> None:
    env = _kept(tmp_path)
    saved = replace(HERE, source="h200-probe.json")
    assert gpuperfs.attach(saved, env) == saved
    own = GpuPerf(prefill_tflops=50.0)
    live_measured = replace(HERE, gpus=(replace(ADA, perf=own),))
    assert gpuperfs.attach(live_measured, env).gpus[0].perf == own


def test_probe_measure_then_plan_on_the_machine_plans_from_the_measured_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI end to end on a stand-in NVML: `probe --measure` (its timing stood in for),
    then `plan` with no --topology names the figures and when they were measured."""
    nv = FakeNvml([FakeGpu(ADA.name, ADA.uuid, ADA.bus_id, ADA.memory_bytes, cc=(8, 9))], {})
    monkeypatch.setenv("TOPOSERVE_CACHE", str(tmp_path))
    monkeypatch.setattr(measure, "measure_topology", lambda topo, env: replace(
        topo, gpus=tuple(replace(g, perf=PERF) for g in topo.gpus)))
    monkeypatch.setattr(cmd_probe, "_host_line", lambda topo, env: "host not timed")
    out = io.StringIO()
    with mock.patch.object(nvml, "import_pynvml", return_value=nv), \
            contextlib.redirect_stdout(out):
        assert main(["probe", "--measure"]) == 0
        probed = out.getvalue()
        assert main(["plan", "--model", model("mistral-7b"), "--max-model-len", "4096"]) == 0
    assert "GPU0 measured figures kept in" in probed
    planned = out.getvalue()[len(probed):]
    assert "planned from figures measured on it by probe --measure at" in planned
    # a plan with an empty cache (another machine's, the replay tool's) plans from the table
    monkeypatch.setenv("TOPOSERVE_CACHE", str(tmp_path / "empty"))
    out = io.StringIO()
    with mock.patch.object(nvml, "import_pynvml", return_value=nv), \
            contextlib.redirect_stdout(out):
        assert main(["plan", "--model", model("mistral-7b"), "--max-model-len", "4096"]) == 0
    assert "measured on it" not in out.getvalue()


def _valid_record() -> dict[str, Any]:
    return gpuperf.kept_to_json(gpuperf.KeptPerf(gpuperfs.gpu_key(ADA, HERE), AT, PERF))


JSON = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers()
                    | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


@st.composite
def mangled(draw: st.DrawFn) -> bytes:
    how = draw(st.sampled_from(["bytes", "json", "field", "measured", "cut"]))
    rec = _valid_record()
    if how == "bytes":
        return draw(st.binary(max_size=200))
    if how == "json":
        return json.dumps(draw(JSON)).encode()
    if how == "cut":
        text = json.dumps(rec).encode()
        return text[: draw(st.integers(0, len(text) - 1))]
    target = rec if how == "field" else rec["measured"]
    target[draw(st.sampled_from(sorted(target)))] = draw(JSON)
    return json.dumps(rec).encode()


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=mangled())
def test_a_mangled_kept_file_plans_from_the_table_with_a_reason_never_a_traceback(
    tmp_path: Path, content: bytes,
) -> None:
    env = {"TOPOSERVE_CACHE": str(tmp_path)}
    path = gpuperfs.cache_path(tmp_path, gpuperfs.gpu_key(ADA, HERE))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    got = gpuperfs.attach(HERE, env)
    new = got.notes[len(HERE.notes):]
    assert all("\n" not in n for n in new)
    if got.gpus[0].perf is None:  # the conservative fallback, said
        assert any("planned from the datasheet table" in n for n in new)
    else:
        assert got.gpus[0].perf.any
        assert any("measured on it by probe --measure at" in n for n in new)


def test_an_unknown_format_or_a_corrupt_file_is_said(tmp_path: Path) -> None:
    env = _kept(tmp_path)
    path = gpuperfs.cache_path(tmp_path, gpuperfs.gpu_key(ADA, HERE))
    path.write_text(json.dumps({**_valid_record(), "format": 9}))
    notes = gpuperfs.attach(HERE, env).notes
    assert any("(is of format 9, not 1): planned from the datasheet table" in n for n in notes)
    path.write_text("{not json")
    got = gpuperfs.attach(HERE, env)
    assert got.gpus[0].perf is None
    assert any("is not JSON: planned from the datasheet table" in n for n in got.notes)
