"""probe --measure: the NCCL log parser on recorded lines, and the no-GPU refusal."""

from __future__ import annotations

import pytest

from launcher.cli import main
from launcher.errors import MeasureError
from launcher.measure import classify, measure_topology, parse_nccl_log
from launcher.topology import Topology

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


def test_probe_measure_cli_without_gpu_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--measure"]) == 6
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no GPU found" in err


def test_measure_refuses_a_saved_topology(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--measure", "--topology", "x.json"]) == 6
    assert "this machine's GPUs" in capsys.readouterr().err
