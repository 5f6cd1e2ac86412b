"""`launcher doctor`: what on this machine will slow down or break multi-GPU serving, with the fix.

:func:`run_checks` is pure over a Topology, the environment and :class:`HostFacts`;
:func:`read_host_facts` is the thin shell that reads /proc, /sys, rlimits and lspci.
"""

from __future__ import annotations

import contextlib
import re
import resource
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from launcher.planner import memfit
from launcher.planner.hardware import gpu_model
from launcher.probe.topology import Topology, pair_link

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
MIN_MEMLOCK = 64 << 20  # pinned host buffers of NCCL and vLLM's KV swap want far more than 64 KiB


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # PASS | WARN | FAIL
    message: str
    fix: str | None = None


@dataclass(frozen=True)
class HostFacts:
    memlock_bytes: int | None = None  # None: unlimited
    governors: tuple[str, ...] = ()  # one per CPU that exposes cpufreq; empty when none does
    iommu_groups: int = 0
    kernel_cmdline: str = ""
    acs_redirect: tuple[str, ...] | None = None  # bridges with ACS redirect on; None: unreadable


def _no_gpu(topo: Topology) -> list[Check]:
    notes = f" ({'; '.join(topo.notes)})" if topo.notes else ""
    return [
        Check(
            "gpu",
            WARN,
            f"no GPU found{notes}: the CPU engine will serve (vLLM's CPU "
            "backend, 1 replica), slowly",
            "install the NVIDIA driver and check `nvidia-smi`; in a container pass the GPUs "
            "(--gpus all); or plan for another machine with --topology FILE",
        )
    ]


def _p2p(topo: Topology) -> list[Check]:
    out = []
    for p in topo.pairs:
        link = pair_link(p)
        name = f"p2p GPU{p.a}-GPU{p.b}"
        if link == "shm":
            why = p.p2p_read or "unknown"
            out.append(
                Check(
                    name,
                    WARN,
                    f"P2P blocked ({why}): tensor parallel between them goes "
                    "through host memory (NCCL SHM), ~30% slower prompt processing",
                    "an NVLink bridge, a board/BIOS that allows P2P (ACS off, IOMMU "
                    "passthrough), or on GeForce the P2P-enabled open kernel module; "
                    "otherwise prefer layer split (PP) or replicas for these two",
                )
            )
        elif p.measured is not None and p.measured.allreduce_ok is False:
            out.append(
                Check(
                    name,
                    FAIL,
                    "P2P is granted but a measured all-reduce returned wrong data",
                    "run with NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce, and "
                    "check the driver/BIOS (ACS, IOMMU)",
                )
            )
        else:
            out.append(Check(name, PASS, f"{link}" + (f" (NV{p.nvlinks})" if p.nvlinks else "")))
    return out


def _nccl_env(topo: Topology, env: Mapping[str, str]) -> list[Check]:
    out = []
    # what the hardware allows, whatever NCCL_P2P_DISABLE makes of it (apply_nccl_env)
    p2p_possible = any(
        pair_link(replace(p, p2p_disabled_by_env=False, measured=None)) in ("nvlink", "p2p-pcie")
        for p in topo.pairs
    )
    if env.get("NCCL_P2P_DISABLE", "0") not in ("", "0"):
        status = WARN if p2p_possible else PASS
        out.append(
            Check(
                "NCCL_P2P_DISABLE",
                status,
                "set: NCCL will not use P2P"
                + (" although these GPUs support it" if p2p_possible else ""),
                "unset NCCL_P2P_DISABLE unless P2P corrupts data here" if p2p_possible else None,
            )
        )
    if env.get("NCCL_SHM_DISABLE", "0") not in ("", "0"):
        shm_needed = any(pair_link(p) == "shm" for p in topo.pairs)
        out.append(
            Check(
                "NCCL_SHM_DISABLE",
                FAIL if shm_needed else WARN,
                "set: without P2P NCCL falls back to sockets, far slower than host memory",
                "unset NCCL_SHM_DISABLE",
            )
        )
    return out


def _pcie(topo: Topology) -> list[Check]:
    out = []
    for g in topo.gpus:
        name = f"pcie GPU{g.index}"
        if g.pcie_width_cur and g.pcie_width_max and g.pcie_width_cur < g.pcie_width_max:
            out.append(
                Check(
                    name,
                    WARN,
                    f"runs x{g.pcie_width_cur} of x{g.pcie_width_max}: TP "
                    "prompt speed loses ~5% at x8 and ~15% at x4 with P2P, more without",
                    "move the card to a slot wired x16, check the BIOS bifurcation "
                    "setting, reseat the card or riser",
                )
            )
        elif g.pcie_gen_cur and g.pcie_gen_max and g.pcie_gen_cur < g.pcie_gen_max:
            out.append(
                Check(
                    name,
                    PASS,
                    f"Gen{g.pcie_gen_cur} now, Gen{g.pcie_gen_max} max: idle "
                    "cards drop the link speed; check under load "
                    "(`nvidia-smi -q -d PCIE` while serving)",
                )
            )
        else:
            out.append(Check(name, PASS, f"Gen{g.pcie_gen_cur or '?'} x{g.pcie_width_cur or '?'}"))
    return out


def _mixed(topo: Topology) -> list[Check]:
    names = sorted({g.name for g in topo.gpus})
    if len(names) < 2:
        return [Check("gpu models", PASS, f"{len(topo.gpus)}× {names[0]}")]
    return [
        Check(
            "gpu models",
            WARN,
            f"mixed: {', '.join(names)}; one model split across them is "
            "sized to the smallest memory and runs at the slowest card's pace",
            "serve from the matching cards (CUDA_VISIBLE_DEVICES), or one replica per card type",
        )
    ]


def _persistence(topo: Topology) -> list[Check]:
    off = [g.index for g in topo.gpus if g.persistence_mode is False]
    if off:
        return [
            Check(
                "persistence mode",
                WARN,
                f"off on GPU {', '.join(map(str, off))}: the driver "
                "unloads between processes, first CUDA call takes seconds and clocks reset",
                "sudo nvidia-smi -pm 1 (or enable nvidia-persistenced)",
            )
        ]
    unknown = all(g.persistence_mode is None for g in topo.gpus)
    return [Check("persistence mode", PASS, "unknown (NVML refused)" if unknown else "on")]


def _mig(topo: Topology) -> list[Check]:
    on = [g.index for g in topo.gpus if g.mig_enabled]
    if not on:
        return []
    return [
        Check(
            "mig mode",
            WARN if len(on) < len(topo.gpus) else FAIL,
            f"on for GPU {', '.join(map(str, on))}: CUDA sees such a card as its MIG slices, and "
            "vLLM cannot split a model over slices; the planner leaves these cards out",
            "; ".join(f"sudo nvidia-smi -i {i} -mig 0" for i in on)
            + " (then reset the GPU or reboot)",
        )
    ]


def _memory_in_use(topo: Topology) -> list[Check]:
    """Memory other processes hold: vLLM starts only where utilization × memory is free."""
    util = memfit.startable_utilization(topo.gpus, 0.9)
    if util >= 0.9:
        read = any(g.memory_used_bytes is not None for g in topo.gpus)
        return [Check("gpu memory in use", PASS, "little" if read else "unknown (not read)")]
    held = memfit.memory_in_use(topo.gpus, 0.9)
    return [
        Check(
            "gpu memory in use",
            WARN,
            f"other processes hold {held}: vLLM at its default --gpu-memory-utilization 0.9 "
            "would refuse to start there; the planner lowers it to "
            f"{util:g}" + (" (nothing left)" if util <= 0 else ""),
            "find them with nvidia-smi; a desktop belongs on another card (or none), another "
            "engine should be stopped",
        )
    ]


def _acs_iommu(topo: Topology, host: HostFacts) -> list[Check]:
    if len(topo.gpus) < 2:
        return []
    out = []
    cmd = host.kernel_cmdline
    passthrough = (
        "iommu=pt" in cmd
        or "iommu=off" in cmd
        or "intel_iommu=off" in cmd
        or "amd_iommu=off" in cmd
    )
    if host.iommu_groups and not passthrough:
        out.append(
            Check(
                "iommu",
                WARN,
                f"IOMMU on ({host.iommu_groups} groups) without passthrough: "
                "peer-to-peer traffic is translated and often redirected through the root "
                "complex, or blocked",
                "boot with iommu=pt (add it to GRUB_CMDLINE_LINUX)",
            )
        )
    else:
        out.append(Check("iommu", PASS, "passthrough or off"))
    if host.acs_redirect is None:
        out.append(Check("acs", PASS, "not checked (needs lspci and root to read ACSCtl)"))
    elif host.acs_redirect:
        out.append(
            Check(
                "acs",
                WARN,
                f"ACS redirect on at {', '.join(host.acs_redirect)}: P2P "
                "between GPUs below these bridges goes up to the root complex",
                "disable ACS in the BIOS, or `setpci -s BDF ECAP_ACS+6.w=0000` per bridge",
            )
        )
    else:
        out.append(Check("acs", PASS, "no bridge redirects peer traffic"))
    return out


def _host(host: HostFacts) -> list[Check]:
    out = []
    if host.memlock_bytes is not None and host.memlock_bytes < MIN_MEMLOCK:
        out.append(
            Check(
                "memlock",
                WARN,
                f"ulimit -l is {host.memlock_bytes // 1024} KiB: NCCL's "
                "RDMA transport (multi-node) cannot register its buffers, and large pinned "
                "allocations can fail",
                "ulimit -l unlimited (systemd: LimitMEMLOCK=infinity; docker: --ulimit memlock=-1)",
            )
        )
    else:
        out.append(
            Check(
                "memlock",
                PASS,
                "unlimited" if host.memlock_bytes is None else f"{host.memlock_bytes >> 20} MiB",
            )
        )
    slow = sorted({g for g in host.governors if g != "performance"})
    if slow:
        out.append(
            Check(
                "cpu governor",
                WARN,
                f"{', '.join(slow)}: the scheduler and sampling run "
                "on the CPU between GPU steps, and a clocked-down core stretches each step",
                "sudo cpupower frequency-set -g performance",
            )
        )
    else:
        out.append(
            Check("cpu governor", PASS, "performance" if host.governors else "not exposed (VM?)")
        )
    return out


def run_checks(topo: Topology, env: Mapping[str, str], host: HostFacts | None) -> list[Check]:
    """Every check, in the order a person would fix them. ``host`` None skips the host checks
    (the topology was recorded on another machine)."""
    if not topo.gpus:
        return [*_no_gpu(topo), *_nccl_env(topo, env), *(_host(host) if host else [])]
    checks = [
        Check(
            "gpu",
            PASS,
            f"{len(topo.gpus)} GPU(s): "
            + ", ".join(
                f"GPU{g.index} {g.name}"
                + ("" if gpu_model(g.name, g.cc).key != "unknown" else " (unknown model)")
                for g in topo.gpus
            ),
        )
    ]
    return [
        *checks,
        *_mixed(topo),
        *_p2p(topo),
        *_nccl_env(topo, env),
        *_pcie(topo),
        *_persistence(topo),
        *_memory_in_use(topo),
        *_mig(topo),
        *(_acs_iommu(topo, host) + _host(host) if host else []),
    ]


def format_checks(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"[{c.status}] {c.name}: {c.message}")
        if c.fix and c.status != PASS:
            lines.append(f"       fix: {c.fix}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ the thin shell


def parse_lspci_acs(text: str) -> tuple[str, ...]:
    """Bridges whose ACSCtl has request or completion redirect on, from `lspci -vvv`."""
    out = []
    for block in re.split(r"\n(?=\S)", text):
        bdf = block.split(" ", 1)[0]
        for line in block.splitlines():
            if "ACSCtl:" in line and ("ReqRedir+" in line or "CmpltRedir+" in line):
                out.append(bdf)
                break
    return tuple(out)


def read_host_facts(root: Path = Path("/")) -> HostFacts:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    governors = []
    for f in sorted((root / "sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor")):
        with contextlib.suppress(OSError):
            # errors="replace": a byte that is not UTF-8 is no governor name, never a traceback
            governors.append(f.read_text(errors="replace").strip())
    groups_dir = root / "sys/kernel/iommu_groups"
    groups = len(list(groups_dir.iterdir())) if groups_dir.is_dir() else 0
    cmdline = ""
    with contextlib.suppress(OSError):
        cmdline = (root / "proc/cmdline").read_text(errors="replace")  # bootloaders pass bytes
    acs: tuple[str, ...] | None = None
    lspci = shutil.which("lspci")
    if lspci:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            res = subprocess.run(
                [lspci, "-vvv"], capture_output=True, text=True, errors="replace", timeout=10,
                check=False,  # errors="replace": VPD strings may hold any bytes
            )
            # without root lspci prints "<access denied>" instead of capabilities
            if res.returncode == 0 and "ACSCap" in res.stdout:
                acs = parse_lspci_acs(res.stdout)
    return HostFacts(
        memlock_bytes=None if soft == resource.RLIM_INFINITY else int(soft),
        governors=tuple(governors),
        iommu_groups=groups,
        kernel_cmdline=cmdline,
        acs_redirect=acs,
    )
