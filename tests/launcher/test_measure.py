"""probe --measure: the NCCL log parser on recorded lines, the no-GPU refusal, and the GEMM
calibration of a GPU (its arithmetic, its timing code on torch CPU, saving and reading it with
the topology, and the planner preferring it over the datasheet table)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.cli.main import main
from launcher.errors import MeasureError
from launcher.model.modelspec import load_model_spec
from launcher.pipeline import enginesteps
from launcher.planner import costmodel, hardware
from launcher.planner.plan import Policy, plan
from launcher.probe import gpuperf, measure
from launcher.probe.enginestep import EngineStepError
from launcher.probe.gpuperf import GpuPerf, Sample
from launcher.probe.measure import classify, measure_topology, parse_nccl_log, time_gemms
from launcher.probe.topology import (
    Gpu,
    Topology,
    load_topology,
    topology_from_json,
    topology_to_json,
)
from tests.conftest import REPO
from tests.launcher.paths import model

# Lines as NCCL 2.18-2.27 print them with NCCL_DEBUG=INFO (host:pid:tid [dev] prefix).
NVLINK_CUMEM = """\
h200:4417:4417 [0] NCCL INFO NCCL version 2.27.3+cuda12.9
h200:4417:4502 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
h200:4418:4503 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
h200:4417:4502 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1
"""
PCIE_IPC = """\
box:2077:2133 [0] NCCL INFO Channel 00/0 : 0[1000] -> 1[2000] via P2P/IPC
box:2077:2133 [0] NCCL INFO Channel 01/0 : 0[1000] -> 1[2000] via P2P/direct pointer
"""
SHM = """\
box:2077:2133 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
box:2077:2133 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct
box:2078:2134 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct/direct
"""
NET = """\
node1:1:257 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0
node1:1:257 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
"""


@pytest.mark.parametrize(
    ("log", "nvlinks", "want", "families"),
    [
        (NVLINK_CUMEM, 18, "nvlink", {"P2P"}),
        (PCIE_IPC, 0, "p2p-pcie", {"P2P"}),
        (SHM, 0, "shm", {"SHM"}),
        (NET, 0, "net", {"NET"}),
        (NVLINK_CUMEM + SHM, 4, "shm", {"P2P", "SHM"}),  # the slowest channel sets the pace
        ("NCCL INFO Bootstrap : Using eth0\n", 0, None, set()),
    ],
)
def test_classifies_the_transport_nccl_chose(
    log: str, nvlinks: int, want: str | None, families: set[str]
) -> None:
    parsed = parse_nccl_log(log)
    assert parsed.transports == families
    assert classify(parsed, nvlinks) == want


def test_parses_ranks_detail_and_version() -> None:
    parsed = parse_nccl_log(NVLINK_CUMEM + PCIE_IPC)
    assert parsed.version == "2.27.3+cuda12.9"
    assert (0, 1, "P2P/CUMEM/read") in parsed.connections
    assert (1, 0, "P2P/CUMEM/read") in parsed.connections
    assert (0, 1, "P2P/direct pointer") in parsed.connections
    assert len(parsed.connections) == 4


def test_receive_and_send_markers_are_skipped() -> None:
    assert {c[2] for c in parse_nccl_log(NET).connections} == {"NET/Socket/0", "NET/IB/0/GDRDMA"}


def test_measuring_without_a_gpu_says_so() -> None:
    with pytest.raises(MeasureError, match="no GPU found"):
        measure_topology(Topology(gpus=()), {})


def test_probe_measure_without_gpu_that_cannot_time_the_engine_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a GPU, --measure times the CPU engine's step (a real vLLM start: the stack test
    # test_cpu_prediction.py runs it); here the worker's failure, as without vLLM installed.
    def fails(env: object) -> str:
        raise EngineStepError("the engine step measurement failed (exit 1): "
                              "ModuleNotFoundError: No module named 'vllm'")

    monkeypatch.setattr(enginesteps, "measure", fails)
    assert main(["probe", "--measure"]) == 6
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no GPU found, and the CPU engine's step could not be timed" in err
    assert "No module named 'vllm'" in err


def test_measure_refuses_a_saved_topology(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--measure", "--topology", "x.json"]) == 6
    assert "this machine's GPUs" in capsys.readouterr().err


# ----------------------------------------------------------------- GEMM calibration of one GPU


def test_prefill_rate_is_total_flops_over_total_time_and_decode_total_bytes() -> None:
    samples = [
        Sample("prefill", 512, 4096, 4096, reps=10, seconds=0.01),
        Sample("prefill", 512, 4096, 16384, reps=10, seconds=0.05),
        Sample("decode", 1, 4096, 16384, reps=20, seconds=0.1),
        Sample("decode", 32, 4096, 16384, reps=20, seconds=0.11),
    ]
    perf = gpuperf.summarize(samples, device="x", method="y")
    flops = 10 * 2 * 512 * 4096 * (4096 + 16384)
    assert perf.prefill_tflops == pytest.approx(flops / 0.06 / 1e12)
    moved = 20 * 2 * (4096 * 16384 + 4096 + 16384)
    moved += 20 * 2 * (4096 * 16384 + 32 * 4096 + 32 * 16384)
    assert perf.decode_gbs == pytest.approx(moved / 0.21 / 1e9)
    assert gpuperf.summarize([]) == GpuPerf()


def test_the_shapes_are_a_512_token_prefill_and_1_to_32_token_decode_of_7_to_70b_models() -> None:
    shapes = gpuperf.default_shapes()
    prefill = {(m, k, n) for kind, m, k, n in shapes if kind == "prefill"}
    decode = {(m, k, n) for kind, m, k, n in shapes if kind == "decode"}
    assert (512, 8192, 4 * 8192) in prefill  # a 70B's up projection
    assert (512, 4 * 4096, 4096) in prefill  # an 8B's down projection
    assert {m for m, _, _ in prefill} == {512}
    assert {m for m, _, _ in decode} == {1, 8, 32}
    assert {k for _, k, _ in decode} == set(gpuperf.HIDDEN_SIZES)


def test_gemm_timing_runs_the_same_code_on_torch_cpu() -> None:
    torch = pytest.importorskip("torch")
    shapes = [*gpuperf.prefill_shapes(32, tokens=8), *gpuperf.decode_shapes(32, (1, 2))]
    samples = time_gemms(torch, "cpu", shapes, reps=2, cycle_bytes=32 * 128 * 2 * 3)
    assert [(s.kind, s.m, s.k, s.n) for s in samples] == shapes
    assert all(s.seconds > 0 for s in samples)
    # decode cycles through 3 weight copies: at least one full pass of them
    assert [s.reps for s in samples] == [2, 2, 2, 3, 3]
    perf = gpuperf.summarize(samples)
    assert perf.prefill_tflops is not None
    assert perf.prefill_tflops > 0
    assert perf.decode_gbs is not None
    assert perf.decode_gbs > 0


def test_the_gemm_worker_writes_figures_the_topology_reader_takes(tmp_path: Path) -> None:
    out = tmp_path / "gemm.json"
    res = subprocess.run(
        [sys.executable, "-m", "launcher.cli.measure_worker", "gemm", "--device", "cpu", "--tiny",
         "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    raw = json.loads(out.read_text())
    assert len(raw["samples"]) == 5
    assert raw["device"] == "cpu"
    assert "bf16 F.linear as vLLM's unquantized linear ([n x k] weights) on cpu" in raw["method"]
    perf, reasons = gpuperf.perf_from_json(raw)
    assert reasons == []
    assert perf is not None
    assert perf.prefill_tflops
    assert perf.decode_gbs


def test_measuring_where_torch_sees_no_cuda_is_a_one_line_error() -> None:
    pytest.importorskip("torch")
    gpu = Gpu(0, "NVIDIA GeForce RTX 4070", "GPU-x", "00000000:01:00.0", 12 << 30, cc=(8, 9))
    with pytest.raises(MeasureError, match=r"GEMM timing on GPU0 failed.*no CUDA device") as exc:
        measure_topology(Topology(gpus=(gpu,)), {})
    assert "\n" not in str(exc.value)


# ------------------------------------------------------------- saved with the topology, read back

# A card the datasheet table has no row for: planned from the sm89 fallback unless measured.
ADA4000 = Gpu(0, "NVIDIA RTX 4000 Ada Generation", "GPU-ada", "00000000:01:00.0", 20 << 30,
              cc=(8, 9), pcie_gen_max=4, pcie_width_cur=16)
MEASURED = GpuPerf(prefill_tflops=88.0, decode_gbs=452.0, device="NVIDIA RTX 4000 Ada Generation",
                   method="torch 2.13 bf16 matmul on cuda, 18 shapes")


def test_measured_figures_are_saved_with_the_topology_and_read_back() -> None:
    topo = Topology(gpus=(replace(ADA4000, perf=MEASURED),))
    data = json.loads(json.dumps(topology_to_json(topo)))
    assert data["gpus"][0]["measured"]["decode_gbs"] == 452.0
    back = topology_from_json(data, "saved.json")
    assert back.gpus[0].perf == MEASURED
    assert any(n.startswith("GPU0: planned from figures measured on it (88.0 TFLOP/s")
               for n in back.notes)
    # a GPU never measured saves null and reads back as unmeasured, silently
    plain = topology_from_json(topology_to_json(Topology(gpus=(ADA4000,))), "plain.json")
    assert plain.gpus[0].perf is None
    assert not any("measured" in n for n in plain.notes)


@pytest.mark.parametrize(("measured", "perf", "reason"), [
    ({"prefill_tflops": 88.0, "decode_gbs": "fast"}, GpuPerf(88.0, None), "decode_gbs 'fast'"),
    ({"prefill_tflops": -1, "decode_gbs": 452}, GpuPerf(None, 452.0), "prefill_tflops -1"),
    ({"prefill_tflops": 1e9}, None, "prefill_tflops 1000000000.0"),
    ({"decode_gbs": 452, "fp8_tflops": 300}, GpuPerf(None, 452.0), "ignored: 'fp8_tflops'"),
    ([1, 2], None, "not an object"),
    ({"decode_gbs": True}, None, "decode_gbs True"),
    ({"decode_gbs": 452, "samples": [{"kind": "decode"}, "x"]}, GpuPerf(None, 452.0),
     "2 unreadable measured sample(s) ignored"),
])
def test_unusable_measured_figures_are_ignored_with_a_reason(
    measured: Any, perf: GpuPerf | None, reason: str
) -> None:
    data = topology_to_json(Topology(gpus=(ADA4000,)))
    data["gpus"][0]["measured"] = measured
    back = topology_from_json(data, "hand-edited.json")
    assert back.gpus[0].perf == perf
    assert any(n.startswith("GPU0: ") and reason in n for n in back.notes), back.notes


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=16), inner,
                                                                 max_size=5),
    max_leaves=12,
)
measured_objects = st.fixed_dictionaries(
    {}, optional={"prefill_tflops": json_values, "decode_gbs": json_values,
                  "device": json_values, "method": json_values, "extra": json_values,
                  "samples": st.lists(st.one_of(json_values, st.fixed_dictionaries(
                      {"kind": st.sampled_from(["prefill", "decode", "x"]), "m": json_values,
                       "k": json_values, "n": json_values, "reps": json_values,
                       "seconds": json_values})), max_size=3),
                  "kernel_s": json_values, "kernel_note": json_values,
                  "graph_samples": st.lists(st.one_of(json_values, st.fixed_dictionaries(
                      {"k": json_values, "n": json_values, "calls": json_values,
                       "seconds": json_values})), max_size=3)})


@given(st.one_of(json_values, measured_objects))
def test_any_measured_value_reads_without_an_exception(measured: Any) -> None:
    perf, reasons = gpuperf.perf_from_json(measured)
    if perf is not None:
        for rate in (perf.prefill_tflops, perf.decode_gbs, perf.kernel_s):
            assert rate is None or (0 < rate < float("inf"))
        assert all(s.call_s > 0 for s in perf.graph_samples)
    assert all(isinstance(r, str) and "\n" not in r for r in reasons)
    data = topology_to_json(Topology(gpus=(ADA4000,)))
    data["gpus"][0]["measured"] = measured
    assert topology_from_json(data, "x.json").gpus[0].index == 0


# ------------------------------------------------------------------ the planner prefers them


def test_the_cost_model_takes_the_measured_rates_over_the_table() -> None:
    measured = replace(ADA4000, perf=MEASURED)
    # no table row for this card: the sm89 fallback's assumed figures
    assert costmodel._mem_bytes_s([ADA4000]) == pytest.approx(300e9 * hardware.MEM_EFFICIENCY)
    assert costmodel._mem_bytes_s([measured]) == pytest.approx(452e9)
    assert costmodel._prefill_flops_s([measured]) == pytest.approx(88e12)
    # a fallback peak below the measured rate is raised to it (decode compute uses the peak)
    assert hardware.gpu_model(measured.name, measured.cc, MEASURED).bf16_tflops == 121
    fast = GpuPerf(prefill_tflops=150.0)
    row = hardware.gpu_model(measured.name, measured.cc, fast)
    assert (row.bf16_tflops, row.prefill_mfu) == (150.0, 1.0)
    assert row.key == "sm89 (measured)"
    # mixed: the slowest card's measured figure sets the pace
    slow = replace(ADA4000, index=1, perf=GpuPerf(decode_gbs=200.0))
    assert costmodel._mem_bytes_s([measured, slow]) == pytest.approx(200e9)


def test_a_plan_from_a_measured_topology_predicts_from_and_names_the_measured_figures(
    tmp_path: Path,
) -> None:
    spec = load_model_spec(model("mistral-7b"))
    policy = Policy(workload="interactive", max_model_len=4096)
    files = {}
    for label, perf in (("table", None), ("measured", MEASURED)):
        path = tmp_path / f"{label}.json"
        path.write_text(json.dumps(topology_to_json(Topology(gpus=(replace(ADA4000,
                                                                          perf=perf),)))))
        files[label] = plan(load_topology(str(path), {}), spec, policy)
    table, measured = files["table"].predicted, files["measured"].predicted
    # decode is bound by weight reads: 452 GB/s measured against 0.8 x 300 assumed
    assert measured.decode_tok_s / table.decode_tok_s == pytest.approx(452 / 240, rel=0.05)
    assert measured.prefill_tok_s > table.prefill_tok_s
    assert any("planned from figures measured on it" in r for r in files["measured"].reasons)
    assert not any("measured" in r for r in files["table"].reasons)


def test_probe_measure_of_one_gpu_times_it_and_saves_the_figures(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """measure_topology end to end with the GEMM worker on torch CPU (tiny shapes): the worker
    process, its JSON, the Gpu's figures, the notes, and the saved file read back."""
    pytest.importorskip("torch")
    real = measure._worker
    seen: list[dict[str, str]] = []

    def on_cpu(args: Sequence[str], env: Mapping[str, str]) -> Any:
        seen.append(dict(env))
        return real([*args, "--device", "cpu", "--tiny"], env)

    monkeypatch.setattr(measure, "_worker", on_cpu)
    topo = measure_topology(Topology(gpus=(replace(ADA4000, index=3),)), {"PATH": "/usr/bin"})
    assert seen[0]["CUDA_VISIBLE_DEVICES"] == "3"  # a process that sees only that GPU
    assert seen[0]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    perf = topo.gpus[0].perf
    assert perf is not None
    assert perf.prefill_tflops
    assert perf.decode_gbs
    assert "GPU3 measured: " in " ".join(topo.notes)
    assert "one GPU: no link to measure" in topo.notes
    saved = tmp_path / "one.json"
    saved.write_text(json.dumps(topology_to_json(topo)))
    back = load_topology(str(saved), {})
    assert back.gpus[0].perf is not None
    assert back.gpus[0].perf.prefill_tflops == pytest.approx(perf.prefill_tflops)
    # every shape timed is kept with the figures, as the record of how they were made
    assert [(s.kind, s.m) for s in back.gpus[0].perf.samples] == [
        ("prefill", 16), ("prefill", 16), ("prefill", 16), ("decode", 1), ("decode", 4)]
