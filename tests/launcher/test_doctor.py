"""The doctor's checks over recorded topologies and host facts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.doctor.checks import (
    FAIL,
    PASS,
    WARN,
    Check,
    HostFacts,
    parse_lspci_acs,
    read_host_facts,
    run_checks,
)
from launcher.probe.topology import Measured, Topology, load_topology
from tests.launcher.paths import topo

GOOD_HOST = HostFacts(memlock_bytes=None, governors=("performance",) * 4, iommu_groups=0)


def by_name(checks: list[Check], prefix: str) -> list[Check]:
    return [c for c in checks if c.name.startswith(prefix)]


def statuses(checks: list[Check], prefix: str) -> set[str]:
    return {c.status for c in by_name(checks, prefix)}


def test_no_gpu_warns_and_names_the_cpu_engine() -> None:
    [gpu, *_] = run_checks(Topology(gpus=()), {}, GOOD_HOST)
    assert gpu.status == WARN
    assert "no GPU found" in gpu.message
    assert "CPU engine" in gpu.message
    assert gpu.fix


@pytest.mark.parametrize(
    ("name", "p2p", "pcie", "models"),
    [
        ("h200x2-nvlink", {PASS}, {PASS}, {PASS}),
        ("2x3090-nvlink-x8x8", {PASS}, {WARN}, {PASS}),
        ("2x3090-pcie-x8x8-nop2p", {WARN}, {WARN}, {PASS}),
        ("2x3090-p2p-x16", {PASS}, {PASS}, {PASS}),
        ("3x3090-one-x4", {WARN}, {WARN}, {PASS}),
        ("4x4090-2socket", {WARN}, {PASS}, {PASS}),
        ("8xh100-nvswitch", {PASS}, {PASS}, {PASS}),
        ("mixed-3090-4090", {WARN}, {WARN}, {WARN}),
    ],
)
def test_topology_checks(name: str, p2p: set[str], pcie: set[str], models: set[str]) -> None:
    t = load_topology(topo(name), {})
    checks = run_checks(t, {}, GOOD_HOST)
    assert statuses(checks, "p2p") == p2p
    assert statuses(checks, "pcie") == pcie
    assert statuses(checks, "gpu models") == models
    for c in checks:
        assert c.status in (PASS, WARN, FAIL)
        if c.status != PASS:
            assert c.fix, c


def test_the_x4_card_is_named() -> None:
    checks = run_checks(load_topology(topo("3x3090-one-x4"), {}), {}, GOOD_HOST)
    [gpu2] = by_name(checks, "pcie GPU2")
    assert "x4 of x16" in gpu2.message


def test_persistence_off_is_a_warning_with_the_command() -> None:
    checks = run_checks(load_topology(topo("2x3090-p2p-x16"), {}), {}, GOOD_HOST)
    [c] = by_name(checks, "persistence")
    assert c.status == WARN
    assert c.fix is not None
    assert "nvidia-smi -pm 1" in c.fix


@pytest.mark.parametrize(
    ("name", "env", "check", "status"),
    [
        ("2x3090-nvlink-x8x8", {"NCCL_P2P_DISABLE": "1"}, "NCCL_P2P_DISABLE", WARN),
        ("2x3090-pcie-x8x8-nop2p", {"NCCL_P2P_DISABLE": "1"}, "NCCL_P2P_DISABLE", PASS),
        ("2x3090-pcie-x8x8-nop2p", {"NCCL_SHM_DISABLE": "1"}, "NCCL_SHM_DISABLE", FAIL),
        ("2x3090-nvlink-x8x8", {"NCCL_SHM_DISABLE": "1"}, "NCCL_SHM_DISABLE", WARN),
    ],
)
def test_nccl_environment(name: str, env: dict[str, str], check: str, status: str) -> None:
    # as `launcher doctor` runs it: the topology read under the same environment
    checks = run_checks(load_topology(topo(name), env), env, GOOD_HOST)
    assert statuses(checks, check) == {status}


def test_corrupting_p2p_fails() -> None:
    t = load_topology(topo("2x3090-p2p-x16"), {})
    bad = replace(t, pairs=(replace(t.pairs[0], measured=Measured(allreduce_ok=False)),))
    assert statuses(run_checks(bad, {}, GOOD_HOST), "p2p") == {FAIL}


@pytest.mark.parametrize(
    ("host", "check", "status"),
    [
        (HostFacts(memlock_bytes=64 * 1024), "memlock", WARN),
        (HostFacts(memlock_bytes=None), "memlock", PASS),
        (HostFacts(governors=("powersave", "performance")), "cpu governor", WARN),
        (HostFacts(governors=()), "cpu governor", PASS),
        (HostFacts(iommu_groups=40, kernel_cmdline="quiet intel_iommu=on"), "iommu", WARN),
        (HostFacts(iommu_groups=40, kernel_cmdline="intel_iommu=on iommu=pt"), "iommu", PASS),
        (HostFacts(acs_redirect=("0000:00:01.0",)), "acs", WARN),
        (HostFacts(acs_redirect=()), "acs", PASS),
    ],
)
def test_host_checks(host: HostFacts, check: str, status: str) -> None:
    checks = run_checks(load_topology(topo("2x3090-p2p-x16"), {}), {}, host)
    assert statuses(checks, check) == {status}


def test_a_saved_topology_skips_this_hosts_checks() -> None:
    checks = run_checks(load_topology(topo("2x3090-p2p-x16"), {}), {}, None)
    assert not by_name(checks, "memlock")
    assert not by_name(checks, "iommu")


LSPCI = """\
00:01.0 PCI bridge: Intel Corporation Device 1234 (rev 05) (prog-if 00 [Normal decode])
\tCapabilities: [220 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
01:00.0 VGA compatible controller: NVIDIA Corporation GA102 [GeForce RTX 3090] (rev a1)
\tSubsystem: NVIDIA Corporation Device 147d
00:03.0 PCI bridge: Intel Corporation Device 5678
\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-
"""


def test_parses_acs_redirect_from_lspci() -> None:
    assert parse_lspci_acs(LSPCI) == ("00:01.0",)


def test_reads_this_hosts_facts() -> None:
    facts = read_host_facts()
    assert facts.memlock_bytes is None or facts.memlock_bytes >= 0
    assert isinstance(facts.governors, tuple)


def test_memory_other_processes_hold_is_a_warning_with_the_utilization_that_starts() -> None:
    checks = run_checks(load_topology(topo("2x3090-desktop-on-gpu0"), {}), {}, None)
    [c] = by_name(checks, "gpu memory in use")
    assert c.status == WARN
    assert "GPU0 3.0 of 24.0 GiB" in c.message
    assert "lowers it to 0.85" in c.message
    assert "GPU1" not in c.message  # its 0.3 GiB leave 0.9 free
    [idle] = by_name(run_checks(load_topology(topo("2x3090-p2p-x16"), {}), {}, None),
                     "gpu memory in use")
    assert idle.status == PASS


def test_mig_mode_is_named_with_the_command_that_turns_it_off() -> None:
    [c] = by_name(run_checks(load_topology(topo("h200x2-gpu1-mig"), {}), {}, None), "mig mode")
    assert c.status == WARN
    assert "GPU 1" in c.message
    assert c.fix is not None
    assert "nvidia-smi -i 1 -mig 0" in c.fix
    assert not by_name(run_checks(load_topology(topo("h200x2-nvlink"), {}), {}, None), "mig")
