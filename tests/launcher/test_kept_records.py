"""A plan made on the machine reads back four kinds of record `probe --measure` kept in the cache
(each GPU's GEMM rates, the host's front-end timing, the model's kernel tables, the CPU engine's
step) through one reader (launcher/probe/keptrecord.py). A kept file that cannot be used (not
JSON, another key's, another format, a field out of range) leaves the plan on what it assumes
without the record, figure for figure, and the plan's reasons say so in one line that names the
file and how to measure again; a file mangled any way is a record or one line, never a
traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.model.modelspec import ModelSpec, load_model_spec
from launcher.model.tinymodel import ensure_tiny_model
from launcher.pipeline import enginesteps, gpuperfs, hostcosts, run
from launcher.pipeline.requests import EngineRequest, PlanRequest
from launcher.planner.kernelcost import step_shape
from launcher.planner.plantypes import Plan, Policy
from launcher.probe import enginestep, gpuperf, hostcost, keptrecord, kernelprobe, kernels
from launcher.probe.enginestep import EngineStep
from launcher.probe.gpuperf import GpuPerf
from launcher.probe.hostcost import HostTiming
from launcher.probe.topology import Topology, load_topology
from tests.launcher.paths import H200, model
from tests.launcher.test_kernels import table_like

AT = "2026-12-05 01:00 UTC"
GPUS = replace(load_topology(str(H200), {}), source="nvml")  # this machine's live reading
CPU = Topology(gpus=(), source="nvml")
GPU_POLICY = Policy(max_model_len=4096)
CPU_POLICY = Policy(cpu_cores=2)


@dataclass(frozen=True)
class Case:
    """One kind of kept record as a plan on this machine reads it: the topology and model
    planned, where the kind's file lies, a valid record's JSON for this machine and one for
    another key, the word its format field goes by, and a field to put out of range."""

    name: str
    topo: Topology
    model: Callable[[], ModelSpec]
    policy: Policy
    path: Callable[[Path], Path]
    valid: Callable[[], dict[str, Any]]
    foreign: Callable[[], dict[str, Any]]
    version: str
    out_of_range: tuple[str, Any]
    used: str  # in the plan's reasons where the valid record was used


def _llama() -> ModelSpec:
    return load_model_spec(model("llama-3.1-8b"))


def _tiny() -> ModelSpec:
    return load_model_spec(str(ensure_tiny_model()))


def _gpu_perf(key: gpuperf.GpuKey) -> dict[str, Any]:
    perf = GpuPerf(prefill_tflops=400.0, decode_gbs=3000.0, device=GPUS.gpus[0].name,
                   method="torch bf16 F.linear as vLLM's unquantized linear, 18 shapes")
    return gpuperf.kept_to_json(gpuperf.KeptPerf(key, AT, perf))


def _gpu_key() -> gpuperf.GpuKey:
    return gpuperfs.gpu_key(GPUS.gpus[0], GPUS)


def _host(key: hostcost.HostKey) -> dict[str, Any]:
    return hostcost.to_json(HostTiming(key, 3e-6, 3e-4, 3e-4, 3e-5, AT))


def _table_key() -> kernels.TableKey:
    return kernelprobe.gpu_key(step_shape(_llama(), 1), GPUS.gpus[0], GPUS.driver)


def _table(key: kernels.TableKey) -> dict[str, Any]:
    return kernels.table_to_json(replace(table_like(step_shape(_llama(), 1), key.device, 0.1),
                                         key=key))


def _step(key: enginestep.StepKey) -> dict[str, Any]:
    m = _tiny()
    return enginestep.to_json(EngineStep(key, 0.0125, (0.0125, 0.013), m.active_params,
                                         m.weight_bytes, AT, model_token_params=m.token_params,
                                         model_head_params=m.lm_head_params))


def _step_key() -> enginestep.StepKey:
    return enginesteps.key_here({})


CASES = [
    Case("gpu-perf", GPUS, _llama, GPU_POLICY,
         lambda cache: gpuperfs.cache_path(cache, _gpu_key()),
         lambda: _gpu_perf(_gpu_key()),
         lambda: _gpu_perf(replace(_gpu_key(), uuid="GPU-another")),
         "format", ("measured", {"prefill_tflops": -4.0}),
         "measured on it by probe --measure at"),
    Case("host-cost", GPUS, _llama, GPU_POLICY,
         lambda cache: hostcost.cache_path(cache, hostcosts.key_here()),
         lambda: _host(hostcosts.key_here()),
         lambda: _host(replace(hostcosts.key_here(), vllm="0.1.0")),
         "version", ("seq_step_s", -1.0),
         "timed on the serving host"),
    Case("kernels", GPUS, _llama, GPU_POLICY,
         lambda cache: kernels.cache_path(cache, _table_key()),
         lambda: _table(_table_key()),
         lambda: _table(replace(_table_key(), torch="0.0.1")),
         "version", ("engine_step_s", -1.0),
         "speed from this model's kernel table"),
    Case("engine-step", CPU, _tiny, CPU_POLICY,
         lambda cache: enginestep.cache_path(cache, _step_key()),
         lambda: _step(_step_key()),
         lambda: _step(replace(_step_key(), vllm="0.1.0")),
         "version", ("step_s", -1.0),
         "from the engine timed on this machine"),
]


def _plan(case: Case, cache: Path) -> Plan:
    request = PlanRequest(None, case.policy, EngineRequest())
    return run.choose(request, case.model(), case.topo, {"TOPOSERVE_CACHE": str(cache)}).plan


def _figures(p: Plan) -> str:
    """Everything a plan holds but its reasons (repr: a NaN figure equals itself)."""
    return repr(replace(p, reasons=()))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_valid_kept_record_is_used_by_the_plan_on_this_machine(
    case: Case, tmp_path: Path,
) -> None:
    """The file each case spoils below is the very one a plan here reads."""
    none = _plan(case, tmp_path / "empty")
    path = case.path(tmp_path)
    assert keptrecord.write_cache_json(path, case.valid()) == path
    used = _plan(case, tmp_path)
    assert any(case.used in r for r in used.reasons), used.reasons
    assert not any(case.used in r for r in none.reasons)
    assert not any(str(path) in r for r in used.reasons)


SPOILED: list[tuple[str, Callable[[Case], bytes], str]] = [
    ("corrupt", lambda c: json.dumps(c.valid()).encode()[:40], "is not JSON"),
    ("foreign key", lambda c: json.dumps(c.foreign()).encode(), "was measured for another key"),
    ("wrong version", lambda c: json.dumps({**c.valid(), c.version: 99}).encode(),
     "cannot be used ("),
    ("out of range", lambda c: json.dumps({**c.valid(), c.out_of_range[0]: c.out_of_range[1]}
                                          ).encode(), "cannot be used ("),
]


@pytest.mark.parametrize("spoil", SPOILED, ids=[s[0] for s in SPOILED])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_an_unusable_kept_record_plans_as_without_it_and_the_plan_says_why_in_one_line(
    case: Case, spoil: tuple[str, Callable[[Case], bytes], str], tmp_path: Path,
) -> None:
    name, content, problem = spoil
    none = _plan(case, tmp_path / "empty")
    path = case.path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(content(case))
    spoiled = _plan(case, tmp_path)
    assert _figures(spoiled) == _figures(none)  # the fallback's figures, unchanged
    said = [r for r in spoiled.reasons if str(path) in r]
    assert len(said) == 1, spoiled.reasons
    line = said[0]
    assert "\n" not in line
    assert problem in line
    assert "`launcher probe --measure" in line
    assert " again" in line
    if name == "wrong version":
        assert "99" in line
    if name == "out of range":
        bad = case.out_of_range[1]
        assert repr(bad if isinstance(bad, float) else bad["prefill_tflops"]) in line, line
    if name == "foreign key":
        assert "differ" in line
    # every other reason is the plan without the file's
    assert [r for r in spoiled.reasons if r != line] == list(none.reasons)


def test_an_absent_record_is_no_reason_and_an_unreadable_one_is(tmp_path: Path) -> None:
    kind, key = hostcost.KEPT, hostcosts.key_here()
    path = hostcost.cache_path(tmp_path, key)
    assert keptrecord.read(kind, path, key) == (None, "")
    path.mkdir(parents=True)  # a directory where the file should be: cannot be read
    rec, why = keptrecord.read(kind, path, key)
    assert rec is None
    assert f"({path}) cannot be read" in why
    assert "again" in why


def test_a_file_larger_than_any_record_is_not_read(tmp_path: Path) -> None:
    kind, key = replace(hostcost.KEPT, max_bytes=100), hostcosts.key_here()
    path = hostcost.cache_path(tmp_path, key)
    assert keptrecord.write_cache_json(path, _host(key)) == path
    assert keptrecord.read(kind, path, key)[1].count("is larger than") == 1


# ------------------------------------------------------------------ any file, any kind of record
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=16,
)


def _kinds() -> list[tuple[keptrecord.Kind[Any, Any], object, dict[str, Any]]]:
    return [(gpuperfs.KEPT, _gpu_key(), _gpu_perf(_gpu_key())),
            (hostcost.KEPT, hostcosts.key_here(), _host(hostcosts.key_here())),
            (kernels.KEPT, _table_key(), _table(_table_key())),
            (enginestep.KEPT, _step_key(), _step(_step_key()))]


KINDS = _kinds()


@st.composite
def mangled(draw: st.DrawFn) -> tuple[int, bytes]:
    """A kind and a file for it: a valid record's JSON mangled one way or another."""
    which = draw(st.integers(0, len(KINDS) - 1))
    rec = json.loads(json.dumps(KINDS[which][2]))
    how = draw(st.sampled_from(["bytes", "json", "cut", "field", "nested", "drop", "same"]))
    if how == "bytes":
        return which, draw(st.binary(max_size=200))
    if how == "json":
        return which, json.dumps(draw(JSON)).encode()
    text = json.dumps(rec).encode()
    if how == "cut":
        return which, text[:draw(st.integers(0, len(text) - 1))]
    if how == "same":
        return which, text
    target = rec
    if how == "nested":
        inner = [k for k, v in rec.items() if isinstance(v, dict) and v]
        if inner:
            target = rec[draw(st.sampled_from(sorted(inner)))]
    field = draw(st.sampled_from(sorted(target)))
    if how == "drop":
        del target[field]
    else:
        target[field] = draw(JSON)
    return which, json.dumps(rec).encode()


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(got=mangled())
def test_any_mangled_file_of_any_kind_is_its_record_or_one_line_never_a_traceback(
    tmp_path: Path, got: tuple[int, bytes],
) -> None:
    which, content = got
    kind, key, _ = KINDS[which]
    path = tmp_path / f"{which}.json"
    path.write_bytes(content)
    rec, why = keptrecord.read(kind, path, key)
    if rec is not None:
        assert why == ""
        assert kind.key_of(rec) == key
    else:
        assert why
        assert "\n" not in why
        assert why.startswith(kind.what)
        assert str(path) in why
        assert why.endswith(kind.again)
