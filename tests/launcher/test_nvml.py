"""The NVML reader, driven by a stand-in pynvml module (no GPU exists on this machine)."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli.main import main
from launcher.cli.probeformat import format_topology
from launcher.probe import nvml
from launcher.probe.topology import assumption_notes, topology_to_json
from tests.launcher.fake_pynvml import FakeGpu, FakeNvml, NVMLError_NotSupported
from tests.launcher.fake_pynvml import NVMLError_GpuIsLost as NVMLErrorGpuIsLost
from tests.launcher.paths import model
from topocommon.nvml import sample_gpus

G3090 = "NVIDIA GeForce RTX 3090"


def two_3090s(refuse: set[str] | None = None, bridge: bool = True) -> FakeNvml:
    r = refuse or set()
    gpus = [
        FakeGpu(
            G3090,
            "GPU-aaaa",
            "00000000:01:00.0",
            24 << 30,
            width=(8, 16),
            nvlink_remote=["00000000:02:00.0"] * 4 if bridge else [],
            refuse=r,
        ),
        FakeGpu(
            G3090,
            "GPU-bbbb",
            "0000:02:00.0",
            24 << 30,
            width=(8, 16),
            nvlink_remote=["00000000:01:00.0"] * 4 if bridge else [],
            refuse=r,
        ),
    ]
    ok = 0 if bridge else 1  # chipset not supported without the bridge
    p2p = {(0, 1, i): ok for i in range(4)} | {(0, 1, 4): 1}
    return FakeNvml(gpus, p2p)


def test_reads_gpus_pairs_and_nvlink_bridge() -> None:
    topo = nvml.read_topology({}, two_3090s())
    assert [g.name for g in topo.gpus] == [G3090, G3090]
    g0 = topo.gpus[0]
    assert (g0.pcie_width_cur, g0.pcie_width_max, g0.pcie_gen_max) == (8, 16, 4)
    assert g0.nvlinks_active == 4
    assert g0.cpu_affinity == "0-7"
    pair = topo.pair(0, 1)
    assert pair.nvlinks == 4
    assert pair.common_ancestor == "PHB"
    assert (pair.p2p_read, pair.p2p_pci) == ("OK", "CHIPSET_NOT_SUPPORTED")
    assert topo.driver == "550.120"


def test_calls_that_geforce_refuses_become_unknown_not_a_crash() -> None:
    refused = {
        "nvmlDeviceGetNumaNodeId",
        "nvmlDeviceGetPersistenceMode",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetP2PStatus",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetCpuAffinity",
    }
    topo = nvml.read_topology({}, two_3090s(refused))
    g0 = topo.gpus[0]
    assert g0.numa_node is None
    assert g0.persistence_mode is None
    assert g0.pcie_width_cur is None
    assert g0.nvlinks_active == 0
    pair = topo.pair(0, 1)
    assert (pair.p2p_read, pair.common_ancestor, pair.nvlinks) == (None, None, 0)
    topology_to_json(topo)  # unknowns serialise


def test_no_driver_gives_zero_gpus() -> None:
    topo = nvml.read_topology({}, FakeNvml([], {}, driver_loaded=False))
    assert topo.gpus == ()
    assert any("no GPU" in n for n in topo.notes)


def test_cuda_visible_devices_narrows_the_reading() -> None:
    topo = nvml.read_topology(
        {"CUDA_VISIBLE_DEVICES": "GPU-bbbb", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, two_3090s()
    )
    assert [g.index for g in topo.gpus] == [1]
    assert topo.pairs == ()


def test_samples_counters_with_units_converted() -> None:
    [s0, s1] = sample_gpus(two_3090s())
    assert s0.name == G3090
    assert s0.utilization_ratio == pytest.approx(0.42)
    assert s0.power_watts == pytest.approx(250.5)
    assert s0.pcie_tx_bytes_per_second == 1000 * 1024
    assert s0.pcie_rx_bytes_per_second == 2000 * 1024
    assert s0.nvlink_tx_bytes_total == 10 * 1024
    assert s0.memory_total_bytes == 24 << 30
    assert s1.index == 1


def test_samples_record_none_where_nvml_refuses() -> None:
    [s0, _] = sample_gpus(
        two_3090s(
            {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetFieldValues", "nvmlDeviceGetPcieThroughput"}
        )
    )
    assert s0.power_watts is None
    assert s0.nvlink_tx_bytes_total is None
    assert s0.pcie_rx_bytes_per_second is None
    assert s0.utilization_ratio is not None


def test_samples_are_empty_without_a_driver() -> None:
    assert sample_gpus(FakeNvml([], {}, driver_loaded=False)) == []


def test_real_pynvml_samples_the_gpus_the_probe_reads_on_this_machine() -> None:
    # The real module against this machine's driver (or its absence): never raises; the metrics
    # sampler and the probe agree on which GPUs there are, and no GPU is always said why.
    topo = nvml.read_topology({})
    samples = sample_gpus()
    assert [s.index for s in samples] == [g.index for g in topo.gpus]
    assert [s.uuid for s in samples] == [g.uuid for g in topo.gpus]
    if not topo.gpus:
        assert topo.notes, "a reading without GPUs must say why"


def test_a_gpu_nvml_cannot_open_is_left_out_with_a_note() -> None:
    fake = two_3090s()
    real_open = fake.nvmlDeviceGetHandleByIndex

    def open_or_lost(i: int) -> int:
        if i == 0:
            raise NVMLErrorGpuIsLost()
        return real_open(i)

    fake.nvmlDeviceGetHandleByIndex = open_or_lost  # type: ignore[method-assign]
    topo = nvml.read_topology({}, fake)
    assert [g.index for g in topo.gpus] == [1]
    assert topo.pairs == ()
    assert any("GPU0" in n and "GpuIsLost" in n for n in topo.notes)


# ------------------------------------------------------- a broken NVML: any call, any failure

NVML_CALLS = sorted(
    name for name in dir(FakeNvml) if name.startswith("nvml") and name != "nvmlShutdown"
)


class _Odd:
    """An answer of no shape NVML gives: no fields, not a number."""


BEHAVIOURS: dict[str, Any] = {
    "not supported": NVMLError_NotSupported(),
    "lost": NVMLErrorGpuIsLost(),
    "type error": TypeError("ctypes argument"),
    "runtime error": RuntimeError("driver/library mismatch"),
    "missing in this pynvml": AttributeError("module 'pynvml' has no attribute"),
}
ANSWERS: dict[str, Any] = {
    "None": None,
    "a string": "garbage",
    "bytes": b"\xff\xfe",
    "negative": -1,
    "huge": 2**80,
    "a float": 3.5,
    "an object": _Odd(),
    "a list": [1, "x"],
}


class BrokenNvml(FakeNvml):
    """Two 3090s whose NVML fails the chosen calls the chosen way."""

    def __init__(self, broken: dict[str, str]) -> None:
        base = two_3090s()
        super().__init__(base.gpus, base.p2p)
        self.broken = broken

    def __getattribute__(self, name: str) -> Any:
        broken = object.__getattribute__(self, "__dict__").get("broken", {})
        if name not in broken:
            return object.__getattribute__(self, name)
        how = broken[name]

        def call(*args: Any) -> Any:
            if how in BEHAVIOURS:
                raise BEHAVIOURS[how]
            return ANSWERS[how]

        return call


BROKEN = st.dictionaries(
    st.sampled_from(NVML_CALLS), st.sampled_from(sorted(BEHAVIOURS) + sorted(ANSWERS)), max_size=6
)


@settings(max_examples=200, deadline=None)
@given(broken=BROKEN)
def test_a_broken_nvml_gives_a_reading_never_an_exception(broken: dict[str, str]) -> None:
    fake = BrokenNvml(broken)
    topo = nvml.read_topology({}, fake)
    assert all(g.index in (0, 1) for g in topo.gpus)
    assert topo.gpus or topo.notes  # no GPU is always said why
    json.dumps(topology_to_json(topo))  # what probe --save writes
    format_topology(topo)
    samples = sample_gpus(BrokenNvml(broken))
    assert {s.index for s in samples} <= {0, 1}


@settings(max_examples=60, deadline=None)
@given(broken=BROKEN)
def test_launcher_probe_and_plan_on_a_broken_nvml_exit_cleanly(broken: dict[str, str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.object(nvml, "import_pynvml", return_value=BrokenNvml(broken)),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        probe = main(["probe"])
        plan = main(["plan", "--model", model("mistral-7b")])
    assert probe == 0, err.getvalue()
    assert plan in (0, 3), err.getvalue()  # 3: nothing fits, said in one line
    assert "Traceback" not in err.getvalue()


def test_a_refused_call_is_named_in_the_reading() -> None:
    topo = nvml.read_topology({}, BrokenNvml({"nvmlDeviceGetNvLinkState": "runtime error"}))
    assert [g.nvlinks_active for g in topo.gpus] == [0, 0]
    broken = nvml.read_topology({}, BrokenNvml({"nvmlDeviceGetMemoryInfo": "an object"}))
    assert [g.memory_bytes for g in broken.gpus] == [0, 0]
    assert any("memory size unknown; assumed unusable" in n for n in assumption_notes(broken))


def test_nvml_init_that_fails_in_any_way_means_no_gpu() -> None:
    for how in ("runtime error", "missing in this pynvml"):
        topo = nvml.read_topology({}, BrokenNvml({"nvmlInit": how}))
        assert topo.gpus == ()
        assert any("no GPU" in n for n in topo.notes)


def test_mig_mode_and_memory_in_use_are_read_live() -> None:
    nv = two_3090s()
    nv.gpus[1].mig, nv.gpus[1].used = (1, 1), 5 << 30
    topo = nvml.read_topology({}, nv)
    # a card without MIG refuses the call (GeForce): not known, not "on"
    assert [g.mig_enabled for g in topo.gpus] == [None, True]
    assert [g.memory_used_bytes for g in topo.gpus] == [300 << 20, 5 << 30]
