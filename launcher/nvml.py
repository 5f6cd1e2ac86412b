"""The one module that talks to NVML (``pynvml`` from nvidia-ml-py).

Every call goes through :func:`_call`, which turns any ``NVMLError`` (NotSupported on GeForce
cards, NoPermission in containers, ...) into the dump's ``"ERR:<name>"`` marker instead of an
exception. The pynvml module is a parameter everywhere, so tests drive this code with a stand-in
module on machines without a GPU.

The reading is a plain NVML dump (docs/topology-format.md; tests/fixtures/topologies/*.nvml.json),
parsed by :func:`launcher.topology.from_nvml_dump`: a live machine and a saved dump take one path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from launcher.topology import Topology, apply_visible_devices, from_nvml_dump

# NVML_P2P_CAPS_INDEX_READ is the tuple (0,) in nvidia-ml-py (a stray comma), so the integers are
# spelled out here: read, write, nvlink, atomics, pci.
P2P_CAPS = {"p2p_read": 0, "p2p_write": 1, "p2p_nvlink": 2, "p2p_atomics": 3, "p2p_pci": 4}
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS is 18 up to Hopper; asking beyond raises, caught.
_ALL_LINKS = 0xFFFFFFFF  # field-value scope meaning "summed over every link"
_FI_NVLINK_TX, _FI_NVLINK_RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}, KiB


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _err(exc: BaseException) -> str:
    return f"ERR:{type(exc).__name__}"


def _call(nv: Any, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        value = fn(*args)
    except nv.NVMLError as exc:
        return _err(exc)
    return value.decode() if isinstance(value, bytes) else value


@contextlib.contextmanager
def session(nv: Any) -> Iterator[bool]:
    """nvmlInit/nvmlShutdown; yields False (no exception) when there is no driver or library."""
    try:
        nv.nvmlInit()
    except nv.NVMLError:
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()


def _cpu_affinity(nv: Any, h: Any) -> str | Any:
    words = _call(nv, nv.nvmlDeviceGetCpuAffinity, h, 4)  # 4 × 64 bits: up to 256 CPUs
    if isinstance(words, str):
        return words
    cpus = [
        w * 64 + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1
    ]
    return _ranges(cpus)


def _ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] → "0-3,8", as nvidia-smi prints CPU affinity."""
    spans: list[list[int]] = []
    for c in cpus:
        if spans and spans[-1][1] == c - 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _dump_gpu(nv: Any, i: int, h: Any) -> dict[str, Any]:
    pci = _call(nv, nv.nvmlDeviceGetPciInfo, h)
    mem = _call(nv, nv.nvmlDeviceGetMemoryInfo, h)
    bus = pci if isinstance(pci, str) else pci.busId
    links = []
    for link in range(NVLINK_MAX_LINKS):
        state = _call(nv, nv.nvmlDeviceGetNvLinkState, h, link)
        if isinstance(state, str):  # NotSupported / InvalidArgument: no such link
            continue
        remote = _call(nv, nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
        rbus = remote if isinstance(remote, str) else remote.busId
        links.append(
            {
                "link": link,
                "active": int(state),
                "remote_bus": rbus.decode() if isinstance(rbus, bytes) else rbus,
            }
        )
    cc = _call(nv, nv.nvmlDeviceGetCudaComputeCapability, h)
    return {
        "index": i,
        "name": _call(nv, nv.nvmlDeviceGetName, h),
        "uuid": _call(nv, nv.nvmlDeviceGetUUID, h),
        "bus_id": bus.decode() if isinstance(bus, bytes) else bus,
        "memory_total": mem if isinstance(mem, str) else int(mem.total),
        "cc": cc if isinstance(cc, str) else list(cc),
        "pcie_gen_cur": _call(nv, nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "pcie_gen_max": _call(nv, nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "pcie_width_cur": _call(nv, nv.nvmlDeviceGetCurrPcieLinkWidth, h),
        "pcie_width_max": _call(nv, nv.nvmlDeviceGetMaxPcieLinkWidth, h),
        "numa_node": _call(nv, nv.nvmlDeviceGetNumaNodeId, h),
        "persistence_mode": _call(nv, nv.nvmlDeviceGetPersistenceMode, h),
        "cpu_affinity": _cpu_affinity(nv, h),
        "nvlinks": links,
    }


def _dump_pair(nv: Any, a: int, b: int, ha: Any, hb: Any) -> dict[str, Any]:
    pair: dict[str, Any] = {
        "a": a,
        "b": b,
        "common_ancestor": _call(nv, nv.nvmlDeviceGetTopologyCommonAncestor, ha, hb),
    }
    for name, cap in P2P_CAPS.items():
        pair[name] = _call(nv, nv.nvmlDeviceGetP2PStatus, ha, hb, cap)
    return pair


def dump(nv: Any) -> dict[str, Any]:
    """This machine's GPUs in the plain NVML dump format; ``{"gpus": []}`` without NVML.

    Indices are NVML's (PCI bus order); CUDA_VISIBLE_DEVICES is applied afterwards.
    """
    with session(nv) as ok:
        if not ok:
            return {"driver": None, "cuda": None, "gpus": [], "pairs": []}
        count = _call(nv, nv.nvmlDeviceGetCount)
        count = 0 if isinstance(count, str) else int(count)
        # A GPU NVML cannot open (lost, no permission) is left out rather than sinking the rest.
        handles = {i: _call(nv, nv.nvmlDeviceGetHandleByIndex, i) for i in range(count)}
        readable = sorted(i for i, h in handles.items() if not isinstance(h, str))
        return {
            "driver": _call(nv, nv.nvmlSystemGetDriverVersion),
            "cuda": _call(nv, nv.nvmlSystemGetCudaDriverVersion),
            "gpus": [_dump_gpu(nv, i, handles[i]) for i in readable],
            "pairs": [
                _dump_pair(nv, a, b, handles[a], handles[b])
                for n, a in enumerate(readable)
                for b in readable[n + 1 :]
            ],
            "unreadable": [f"GPU{i}: {h}" for i, h in handles.items() if isinstance(h, str)],
        }


def read_topology(env: Mapping[str, str], nv: Any = None) -> Topology:
    """This machine's topology as ``env`` (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER) would see it.

    No pynvml, no driver or no GPU all give a Topology without GPUs, never an exception.
    """
    nv = nv if nv is not None else _import_pynvml()
    if nv is None:
        return Topology(gpus=(), source="nvml", notes=("nvidia-ml-py (pynvml) is not installed",))
    data = dump(nv)
    topo = from_nvml_dump(data, source="nvml")
    lost = data.get("unreadable") or []
    if lost:
        topo = replace(topo, notes=(*topo.notes, f"NVML could not open {', '.join(lost)}"))
    if not data["gpus"]:
        topo = Topology(
            gpus=(), source="nvml", notes=("NVML found no GPU (no driver or no device)",)
        )
    return apply_visible_devices(topo, env)


# ------------------------------------------------------------------------------- live samples


@dataclass(frozen=True)
class GpuSample:
    """One GPU's counters at one instant; ``None`` where NVML refused."""

    index: int
    name: str
    uuid: str
    utilization_ratio: float | None
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    power_watts: float | None
    pcie_tx_bytes_per_second: float | None
    pcie_rx_bytes_per_second: float | None
    nvlink_tx_bytes_total: float | None
    nvlink_rx_bytes_total: float | None


def _num(value: Any, scale: float = 1.0) -> float | None:
    return None if isinstance(value, str) or value is None else float(value) * scale


def _nvlink_bytes(nv: Any, h: Any) -> tuple[float | None, float | None]:
    values = _call(
        nv,
        nv.nvmlDeviceGetFieldValues,
        h,
        [(_FI_NVLINK_TX, _ALL_LINKS), (_FI_NVLINK_RX, _ALL_LINKS)],
    )
    if isinstance(values, str):
        return None, None
    out: list[float | None] = []
    for v in values:
        # nvmlReturn per field: 0 is success; the counters are KiB.
        out.append(float(v.value.ullVal) * 1024 if int(v.nvmlReturn) == 0 else None)
    return out[0], out[1]


def _sample_one(nv: Any, i: int) -> GpuSample:
    h = nv.nvmlDeviceGetHandleByIndex(i)
    util = _call(nv, nv.nvmlDeviceGetUtilizationRates, h)
    mem = _call(nv, nv.nvmlDeviceGetMemoryInfo, h)
    tx, rx = _nvlink_bytes(nv, h)
    return GpuSample(
        index=i,
        name=str(_call(nv, nv.nvmlDeviceGetName, h)),
        uuid=str(_call(nv, nv.nvmlDeviceGetUUID, h)),
        utilization_ratio=None if isinstance(util, str) else float(util.gpu) / 100.0,
        memory_used_bytes=None if isinstance(mem, str) else float(mem.used),
        memory_total_bytes=None if isinstance(mem, str) else float(mem.total),
        power_watts=_num(_call(nv, nv.nvmlDeviceGetPowerUsage, h), 1e-3),  # milliwatts
        # KB/s over NVML's 20 ms window.
        pcie_tx_bytes_per_second=_num(_call(nv, nv.nvmlDeviceGetPcieThroughput, h, 0), 1024.0),
        pcie_rx_bytes_per_second=_num(_call(nv, nv.nvmlDeviceGetPcieThroughput, h, 1), 1024.0),
        nvlink_tx_bytes_total=tx,
        nvlink_rx_bytes_total=rx,
    )


def sample_gpus(nv: Any = None) -> list[GpuSample]:
    """Counters of every GPU NVML sees (all of them: a metrics exporter ignores
    CUDA_VISIBLE_DEVICES); an empty list without NVML or GPUs."""
    nv = nv if nv is not None else _import_pynvml()
    if nv is None:
        return []
    with session(nv) as ok:
        if not ok:
            return []
        count = _call(nv, nv.nvmlDeviceGetCount)
        if isinstance(count, str):
            return []
        return [_sample_one(nv, i) for i in range(int(count))]
