"""Loading topologies: the real H200 dump, our own JSON, and CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.errors import TopologyError
from launcher.probe.topology import (
    Gpu,
    Measured,
    Topology,
    load_topology,
    pair_link,
    topology_from_json,
    topology_to_json,
    visible_gpus,
)
from tests.launcher.paths import H200, topo


def test_reads_the_real_h200_dump() -> None:
    t = load_topology(str(H200), {})
    assert [g.name for g in t.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert t.gpus[0].memory_bytes == 150754820096
    assert t.gpus[0].cc == (9, 0)
    assert t.gpus[0].numa_node is None  # "ERR:NVMLError_NotSupported"
    assert t.gpus[0].nvlinks_active == 18
    p = t.pair(0, 1)
    # remote bus FFFFFFFF:FF:FF.0 in the VM: attributed through P2P-over-NVLink OK
    assert p.nvlinks == 18
    assert (p.common_ancestor, p.p2p_nvlink, p.p2p_pci) == ("PHB", "OK", "NOT_SUPPORTED")
    assert pair_link(p) == "nvlink"
    assert (t.driver, t.cuda) == ("580.159.04", 13000)


@pytest.mark.parametrize(
    ("name", "links"),
    [
        ("2x3090-nvlink-x8x8", {(0, 1): "nvlink"}),
        ("2x3090-pcie-x8x8-nop2p", {(0, 1): "shm"}),
        ("2x3090-p2p-x16", {(0, 1): "p2p-pcie"}),
        ("3x3090-one-x4", {(0, 1): "shm", (0, 2): "shm"}),
        ("4x4090-2socket", {(0, 1): "shm", (1, 2): "shm"}),
        ("8xh100-nvswitch", {(0, 7): "nvlink", (3, 4): "nvlink"}),
        ("mixed-3090-4090", {(0, 1): "shm"}),
    ],
)
def test_each_fixture_names_its_links(name: str, links: dict[tuple[int, int], str]) -> None:
    t = load_topology(topo(name), {})
    for (a, b), want in links.items():
        assert pair_link(t.pair(a, b)) == want


def test_nvswitch_links_count_for_every_pair() -> None:
    t = load_topology(topo("8xh100-nvswitch"), {})
    assert {t.pair(a, b).nvlinks for a in range(8) for b in range(a + 1, 8)} == {18}


def test_memory_in_use_is_read_from_a_dump_and_kept_in_our_own_format(tmp_path: Path) -> None:
    t = load_topology(topo("2x3090-desktop-on-gpu0"), {})
    assert [g.memory_used_bytes for g in t.gpus] == [3 << 30, 300 << 20]
    f = tmp_path / "t.json"
    f.write_text(json.dumps(topology_to_json(t)))
    assert load_topology(str(f), {}).gpus == t.gpus
    # a dump without it (every older one) reads as not known
    assert {g.memory_used_bytes for g in load_topology(topo("2x3090-p2p-x16"), {}).gpus} == {None}


def test_mig_mode_is_read_from_a_dump_and_kept_in_our_own_format(tmp_path: Path) -> None:
    t = load_topology(topo("h200x2-gpu1-mig"), {})
    assert [g.mig_enabled for g in t.gpus] == [False, True]
    f = tmp_path / "t.json"
    f.write_text(json.dumps(topology_to_json(t)))
    assert [g.mig_enabled for g in load_topology(str(f), {}).gpus] == [False, True]


def test_own_json_round_trips_with_measurements(tmp_path: Path) -> None:
    t = load_topology(topo("2x3090-p2p-x16"), {})
    measured = replace(
        t.pairs[0],
        measured=Measured(
            bandwidth_gbs=24.1, latency_us=9.5, nccl_transport="p2p-pcie", allreduce_ok=True
        ),
    )
    t = replace(t, pairs=(measured,))
    f = tmp_path / "t.json"
    f.write_text(json.dumps(topology_to_json(t)))
    back = load_topology(str(f), {})
    assert back.gpus == t.gpus
    assert back.pairs == t.pairs
    assert back.source == str(f)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "cannot read topology file"),
        ('{"format": "toposerve-topology/9", "gpus": []}', "unknown topology format"),
        ('{"nothing": 1}', "no 'gpus' list"),
        ('{"gpus": [{"name": "x"}]}', r"none of the 1 entries of 'gpus' is a usable GPU.*index"),
        ('{"gpus": "ERR:NVMLError_Unknown"}', "'gpus' is NVML refused: NVMLError_Unknown"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_bad_files_say_what_is_wrong(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(TopologyError, match=message):
        load_topology(str(f), {})


def test_missing_file_says_how_to_make_one() -> None:
    with pytest.raises(TopologyError, match="probe --save"):
        load_topology("/nonexistent/topo.json", {})


def _gpu(i: int, cc: tuple[int, int]) -> Gpu:
    return Gpu(
        index=i,
        name=f"g{i}",
        uuid=f"GPU-{i}{i}{i}-abc",
        bus_id=f"00000000:0{i}:00.0",
        memory_bytes=1,
        cc=cc,
    )


GPUS = (_gpu(0, (8, 6)), _gpu(1, (8, 9)), _gpu(2, (8, 6)))


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, [0, 1, 2]),
        ({"CUDA_VISIBLE_DEVICES": "2,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [2, 0]),
        # CUDA's default order puts the newest compute capability first
        ({"CUDA_VISIBLE_DEVICES": "0"}, [1]),
        ({"CUDA_VISIBLE_DEVICES": "1,2"}, [0, 2]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-222"}, [2]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-111-abc,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [1, 0]),
        # parsing stops at the first entry that names nothing, as in CUDA
        ({"CUDA_VISIBLE_DEVICES": "0,7,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [0]),
        ({"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, []),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, []),
        # an ambiguous UUID prefix names nothing
        ({"CUDA_VISIBLE_DEVICES": "GPU-"}, []),
    ],
)
def test_cuda_visible_devices_mapping(env: dict[str, str], want: list[int]) -> None:
    got, _ = visible_gpus(GPUS, env)
    assert [g.index for g in got] == want


def test_visible_devices_filter_pairs_and_leave_a_note() -> None:
    t = load_topology(
        topo("4x4090-2socket"), {"CUDA_VISIBLE_DEVICES": "1,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    )
    assert [g.index for g in t.gpus] == [1, 3]
    assert [(p.a, p.b) for p in t.pairs] == [(1, 3)]
    assert any("CUDA_VISIBLE_DEVICES" in n for n in t.notes)


def test_project_json_is_told_apart_from_the_dump() -> None:
    t = Topology(gpus=GPUS)
    assert topology_from_json(topology_to_json(t)).gpus == GPUS


def test_nccl_p2p_disable_plans_the_transport_nccl_will_use() -> None:
    from launcher.probe.topology import pair_link

    free = load_topology(str(H200), {})
    off = load_topology(str(H200), {"NCCL_P2P_DISABLE": "1"})
    assert [pair_link(p) for p in free.pairs] == ["nvlink"]
    assert [pair_link(p) for p in off.pairs] == ["shm"]  # NVLink unused: NCCL logs via SHM
    assert any("NCCL_P2P_DISABLE" in n for n in off.notes)
    assert load_topology(str(H200), {"NCCL_P2P_DISABLE": "0"}).pairs == free.pairs


def test_nccl_p2p_disable_drops_a_link_measured_over_p2p_but_keeps_one_measured_over_shm() -> None:
    from tests.launcher.paths import TOPOLOGIES

    env = {"NCCL_P2P_DISABLE": "1"}
    over_p2p = load_topology(str(TOPOLOGIES / "h200x2-measured.toposerve.json"), env)
    over_shm = load_topology(str(TOPOLOGIES / "h200x2-p2p-disabled.toposerve.json"), env)
    assert over_p2p.pairs[0].measured is None
    assert over_shm.pairs[0].measured is not None
    assert over_shm.pairs[0].measured.nccl_transport == "shm"
