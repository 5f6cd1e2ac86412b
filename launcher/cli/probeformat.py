"""Topology → the matrix a person reads at a glance (like `nvidia-smi topo -m`, plus P2P and
PCIe lane width). Pure."""

from __future__ import annotations

from launcher.model.modelspec import GIB
from launcher.planner import costmodel
from launcher.probe.topology import Gpu, Pair, Topology, pair_link

P2P_SHORT = {
    "OK": "OK",
    "CHIPSET_NOT_SUPPORTED": "CNS",
    "GPU_NOT_SUPPORTED": "GNS",
    "IOH_TOPOLOGY_NOT_SUPPORTED": "TNS",
    "DISABLED_BY_REGKEY": "DRK",
    "NOT_SUPPORTED": "NS",
    "UNKNOWN": "U",
    None: "?",
}
LEGEND = (
    "Legend: NV# = # NVLinks joining the pair; PIX = one PCIe switch; PXB = several PCIe "
    "switches; PHB = a CPU host bridge; NODE = host bridges of one NUMA node; SYS = across "
    "sockets (QPI/UPI/xGMI).\nP2P (read/write): OK, CNS chipset not supported, GNS GPU not "
    "supported, TNS IOH topology not supported, DRK disabled by regkey, NS not supported, "
    "? NVML refused to say."
)


def _link_cell(p: Pair) -> str:
    return f"NV{p.nvlinks}" if p.nvlinks else (p.common_ancestor or "?")


def _p2p_cell(p: Pair) -> str:
    r, w = P2P_SHORT.get(p.p2p_read, "U"), P2P_SHORT.get(p.p2p_write, "U")
    return r if r == w else f"{r}/{w}"


def _pcie(g: Gpu) -> str:
    def part(gen: int | None, width: int | None) -> str:
        return f"Gen{gen if gen else '?'} x{width if width else '?'}"

    text = (
        f"{part(g.pcie_gen_cur, g.pcie_width_cur)} (max {part(g.pcie_gen_max, g.pcie_width_max)})"
    )
    if g.pcie_width_cur and g.pcie_width_max and g.pcie_width_cur < g.pcie_width_max:
        text += " NARROW"
    return text


def _cc(g: Gpu) -> str:
    return ".".join(map(str, g.cc)) if g.cc else "?"


def _ok(flag: bool | None) -> str:
    return "?" if flag is None else "OK" if flag else "WRONG"


def _matrix(topo: Topology, cell: str) -> list[str]:
    head = "".join(f"{'GPU' + str(g.index):>7}" for g in topo.gpus)
    rows = [f"{'':6}{head}"]
    for a in topo.gpus:
        cells = []
        for b in topo.gpus:
            if a.index == b.index:
                cells.append(f"{'X':>7}")
                continue
            p = topo.pair(a.index, b.index)
            cells.append(f"{_link_cell(p) if cell == 'link' else _p2p_cell(p):>7}")
        rows.append(f"{'GPU' + str(a.index):<6}{''.join(cells)}")
    return rows


def format_topology(topo: Topology) -> str:
    if not topo.gpus:
        return "\n".join(["No GPU found: the launcher will plan the CPU engine.", *topo.notes])
    lines = [f"Source: {topo.source}  driver {topo.driver or '?'}  CUDA {topo.cuda or '?'}", ""]
    lines += ["GPUs:"]
    for g in topo.gpus:
        lines.append(
            f"  GPU{g.index}  {g.name}  {g.memory_bytes / GIB:.1f} GiB  cc {_cc(g)}"
            f"  PCIe {_pcie(g)}  NUMA {g.numa_node if g.numa_node is not None else '?'}"
            f"  CPUs {g.cpu_affinity or '?'}  {g.bus_id}  {g.uuid}"
        )
    if len(topo.gpus) > 1:
        lines += [
            "",
            "Links:",
            *_matrix(topo, "link"),
            "",
            "P2P (read/write):",
            *_matrix(topo, "p2p"),
        ]
        lines += [
            "",
            "Transport per pair (what NCCL would use, and the bandwidth the planner assumes):",
        ]
        for p in topo.pairs:
            a, b = topo.gpu(p.a), topo.gpu(p.b)
            link = costmodel.link_between(topo, a, b)
            m = p.measured
            seen = ""
            if m is not None:
                seen = (
                    f"  measured: copy {m.bandwidth_gbs or 0:.1f} GB/s, all-reduce "
                    f"{m.allreduce_gbs or 0:.1f} GB/s, {m.latency_us or 0:.1f} us, "
                    f"NCCL {m.nccl_transport}, result {_ok(m.allreduce_ok)}"
                )
            lines.append(f"  GPU{p.a}-GPU{p.b}: {pair_link(p):<8} ~{link.gbs:.1f} GB/s{seen}")
        lines += ["", LEGEND]
    lines += [f"Note: {n}" for n in topo.notes]
    return "\n".join(lines)
