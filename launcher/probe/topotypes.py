"""The topology's values: GPUs, pairs, what `probe --measure` saw, and the names of NVML's codes.

Frozen dataclasses with no I/O; :mod:`launcher.probe.topoparse` reads them from files and NVML
dumps,
:mod:`launcher.probe.topology` loads and narrows them (and re-exports everything here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.probe.enginestep import EngineStep
from launcher.probe.gpuperf import GpuPerf
from launcher.probe.hostcost import HostTiming

FORMAT = "toposerve-topology/1"

# nvmlGpuTopologyLevel_t → the names `nvidia-smi topo -m` prints.
ANCESTOR_NAMES = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
ANCESTOR_RANK = {"X": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}

# nvmlGpuP2PStatus_t, named.
P2P_STATUS_NAMES = {
    0: "OK",
    1: "CHIPSET_NOT_SUPPORTED",
    2: "GPU_NOT_SUPPORTED",
    3: "IOH_TOPOLOGY_NOT_SUPPORTED",
    4: "DISABLED_BY_REGKEY",
    5: "NOT_SUPPORTED",
    6: "UNKNOWN",
}
P2P_FIELDS = ("p2p_read", "p2p_write", "p2p_nvlink", "p2p_atomics", "p2p_pci")

# What the cost model assumes where NVML did not say (docs/topology-format.md): the slow case, so
# an unknown never makes a plan promise more than the hardware gives. x4 is the narrowest slot
# width GPUs commonly sit in; Gen3 the oldest generation still common.
ASSUMED_PCIE_WIDTH = 4
ASSUMED_PCIE_GEN = 3


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    bus_id: str
    memory_bytes: int
    cc: tuple[int, int] | None = None
    pcie_gen_cur: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_cur: int | None = None
    pcie_width_max: int | None = None
    numa_node: int | None = None
    nvlinks_active: int = 0
    persistence_mode: bool | None = None
    cpu_affinity: str | None = None
    # GEMM rates `probe --measure` timed on this card (launcher/probe/gpuperf.py); saved as the GPU
    # entry's "measured" object. The planner uses them over the datasheet table.
    perf: GpuPerf | None = None
    # memory other processes held when the reading was taken (a desktop, another engine);
    # None when not read. vLLM refuses to start unless utilization × total is free.
    memory_used_bytes: int | None = None
    # MIG on: CUDA sees the card's MIG slices, not the card, and NCCL joins no slices, so the
    # planner leaves it out. None: not read (or a card without MIG, which refuses the call).
    mig_enabled: bool | None = None


@dataclass(frozen=True)
class Measured:
    """What `probe --measure` saw for one pair; overrides the assumed link figures."""

    bandwidth_gbs: float | None = None  # unidirectional peer copy, GB/s (1e9 bytes)
    allreduce_gbs: float | None = None  # NCCL all-reduce bus bandwidth, 64 MiB, GB/s
    latency_us: float | None = None  # NCCL all-reduce of one value
    nccl_transport: str | None = None  # 'nvlink' | 'p2p-pcie' | 'shm' | 'net'
    allreduce_ok: bool | None = None


@dataclass(frozen=True)
class Pair:
    a: int
    b: int
    nvlinks: int = 0
    common_ancestor: str | None = None  # PIX/PXB/PHB/NODE/SYS, None when unknown
    p2p_read: str | None = None  # P2P_STATUS_NAMES value, None when NVML refused
    p2p_write: str | None = None
    p2p_nvlink: str | None = None
    p2p_atomics: str | None = None
    p2p_pci: str | None = None
    measured: Measured | None = None
    # NCCL_P2P_DISABLE in the launcher's environment (see apply_nccl_env): a fact of this run,
    # not of the hardware, so it is not saved with the topology.
    p2p_disabled_by_env: bool = False

    @property
    def p2p_ok(self) -> bool:
        """Whether CUDA peer access is granted (over PCIe or NVLink)."""
        return self.p2p_read == "OK" and self.p2p_write == "OK"


@dataclass(frozen=True)
class Topology:
    gpus: tuple[Gpu, ...]
    pairs: tuple[Pair, ...] = ()
    driver: str | None = None
    cuda: int | None = None
    source: str = "nvml"
    notes: tuple[str, ...] = field(default=())
    # the engine's decode step timed on this machine (`probe --measure` on a machine without
    # GPUs; launcher/probe/enginestep.py), attached from the cache when planning here: a fact
    # of this run's machine, not saved with the topology
    engine_step: EngineStep | None = field(default=None, compare=False)
    # this host's front-end work timed by `probe --measure` (launcher/probe/hostcost.py),
    # attached from the cache when planning here; likewise not saved with the topology
    host_timing: HostTiming | None = field(default=None, compare=False)
    # the host's free memory (MemAvailable) when it was read: what KV offloading to host memory
    # may be sized from. Saved with the topology, so that a plan made elsewhere sizes it for the
    # machine that will serve, not for the one planning; None: not known
    host_available_bytes: int | None = None

    def gpu(self, index: int) -> Gpu:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(index)

    def pair(self, a: int, b: int) -> Pair:
        lo, hi = min(a, b), max(a, b)
        for p in self.pairs:
            if p.a == lo and p.b == hi:
                return p
        return Pair(a=lo, b=hi)


def normalize_bus_id(bus: str) -> str:
    """``0000:01:00.0`` and ``00000000:01:00.0`` are one device: upper-case, 8-digit domain.

    A bus id that is not ``DOMAIN:BUS:DEV.FN`` in hex is kept as written (upper-cased)."""
    bus = bus.strip().upper()
    domain, sep, rest = bus.partition(":")
    if not sep or not domain:
        return bus
    try:
        return f"{int(domain, 16):08X}:{rest}"
    except ValueError:
        return bus
