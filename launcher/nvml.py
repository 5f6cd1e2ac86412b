"""The one module that talks to NVML (``pynvml`` from nvidia-ml-py).

Every call goes through :func:`_call`, which turns any exception of the call (``NVMLError``:
NotSupported on GeForce cards, NoPermission in containers, ...; also a function an old
nvidia-ml-py lacks, or a binding that fails some other way) into the dump's ``"ERR:<name>"``
marker, and every answer is checked for the shape it should have before it is used, so a broken
NVML makes an unknown, never an exception. The pynvml module is a parameter everywhere, so tests
drive this code with a stand-in module on machines without a GPU.

The reading is a plain NVML dump (docs/topology-format.md; tests/fixtures/topologies/*.nvml.json),
parsed by :func:`launcher.topology.from_nvml_dump`: a live machine and a saved dump take one path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from launcher.errors import TopologyError
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
    except Exception:  # not installed, or a broken install: no NVML either way
        return None
    return pynvml


def _err(exc: BaseException) -> str:
    return f"ERR:{type(exc).__name__}"


def _call(nv: Any, fn: str, *args: Any) -> Any:
    """``nv.<fn>(*args)``, or ``"ERR:<exception>"`` when it raises (or does not exist).

    Any exception, not only NVMLError: the bindings are ctypes over a driver library this process
    does not control, and a missing or misbehaving call must cost one value, not the probe.
    """
    try:
        value = getattr(nv, fn)(*args)
    except Exception as exc:  # any: see the docstring
        return _err(exc)
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _bus(info: Any) -> Any:
    """The ``busId`` of an nvmlPciInfo_t (bytes in older bindings), or an ERR marker."""
    if isinstance(info, str):
        return info
    bus = getattr(info, "busId", None)
    if isinstance(bus, bytes):
        return bus.decode(errors="replace")
    return bus if isinstance(bus, str) else "ERR:NoBusId"


@contextlib.contextmanager
def session(nv: Any) -> Iterator[bool]:
    """nvmlInit/nvmlShutdown; yields False (no exception) when there is no driver or library."""
    if isinstance(_call(nv, "nvmlInit"), str):
        yield False
        return
    try:
        yield True
    finally:
        _call(nv, "nvmlShutdown")


def _cpu_affinity(nv: Any, h: Any) -> Any:
    words = _call(nv, "nvmlDeviceGetCpuAffinity", h, 4)  # 4 × 64 bits: up to 256 CPUs
    if isinstance(words, str):
        return words
    try:
        masks = [int(word) for word in words]
    except (TypeError, ValueError, OverflowError) as exc:
        return _err(exc)
    return _ranges(
        [w * 64 + bit for w, word in enumerate(masks) for bit in range(64) if word >> bit & 1]
    )


def _ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] → "0-3,8", as nvidia-smi prints CPU affinity."""
    spans: list[list[int]] = []
    for c in cpus:
        if spans and spans[-1][1] == c - 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _attr(value: Any, name: str) -> Any:
    """A field of a struct NVML returned, or the ERR marker it already is (or becomes)."""
    return value if isinstance(value, str) else getattr(value, name, "ERR:Missing_" + name)


def _pair_of_ints(value: Any) -> Any:
    """(major, minor) as a list; an ERR marker or another shape is kept for the reader."""
    try:
        major, minor = value
        return [int(major), int(minor)]
    except (TypeError, ValueError, OverflowError):
        return value if isinstance(value, str) else f"ERR:Unreadable_{type(value).__name__}"


def _dump_links(nv: Any, h: Any) -> list[dict[str, Any]]:
    links = []
    for link in range(NVLINK_MAX_LINKS):
        state = _call(nv, "nvmlDeviceGetNvLinkState", h, link)
        if isinstance(state, str):  # NotSupported / InvalidArgument: no such link
            continue
        remote = _call(nv, "nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        links.append({"link": link, "active": state, "remote_bus": _bus(remote)})
    return links


def _dump_gpu(nv: Any, i: int, h: Any) -> dict[str, Any]:
    def ask(fn: str) -> Any:
        return _call(nv, fn, h)

    memory = ask("nvmlDeviceGetMemoryInfo")
    return {
        "index": i,
        "name": ask("nvmlDeviceGetName"),
        "uuid": ask("nvmlDeviceGetUUID"),
        "bus_id": _bus(ask("nvmlDeviceGetPciInfo")),
        "memory_total": _attr(memory, "total"),
        "memory_used": _attr(memory, "used"),
        "cc": _pair_of_ints(ask("nvmlDeviceGetCudaComputeCapability")),
        "pcie_gen_cur": ask("nvmlDeviceGetCurrPcieLinkGeneration"),
        "pcie_gen_max": ask("nvmlDeviceGetMaxPcieLinkGeneration"),
        "pcie_width_cur": ask("nvmlDeviceGetCurrPcieLinkWidth"),
        "pcie_width_max": ask("nvmlDeviceGetMaxPcieLinkWidth"),
        "numa_node": ask("nvmlDeviceGetNumaNodeId"),
        "persistence_mode": ask("nvmlDeviceGetPersistenceMode"),
        # [current, pending]; cards without MIG (GeForce) refuse the call: ERR:NotSupported
        "mig_mode": _pair_of_ints(ask("nvmlDeviceGetMigMode")),
        "cpu_affinity": _cpu_affinity(nv, h),
        "nvlinks": _dump_links(nv, h),
    }


def _dump_pair(nv: Any, a: int, b: int, ha: Any, hb: Any) -> dict[str, Any]:
    pair: dict[str, Any] = {
        "a": a,
        "b": b,
        "common_ancestor": _call(nv, "nvmlDeviceGetTopologyCommonAncestor", ha, hb),
    }
    for name, cap in P2P_CAPS.items():
        pair[name] = _call(nv, "nvmlDeviceGetP2PStatus", ha, hb, cap)
    return pair


def _count(nv: Any) -> int:
    """How many GPUs NVML has; 0 when it cannot say (a count above 4096 is no real answer)."""
    count = _call(nv, "nvmlDeviceGetCount")
    return (
        count
        if isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= 4096
        else 0
    )


def dump(nv: Any) -> dict[str, Any]:
    """This machine's GPUs in the plain NVML dump format; ``{"gpus": []}`` without NVML.

    Indices are NVML's (PCI bus order); CUDA_VISIBLE_DEVICES is applied afterwards.
    """
    with session(nv) as ok:
        if not ok:
            return {"driver": None, "cuda": None, "gpus": [], "pairs": []}
        # A GPU NVML cannot open (lost, no permission) is left out rather than sinking the rest.
        handles = {i: _call(nv, "nvmlDeviceGetHandleByIndex", i) for i in range(_count(nv))}
        readable = sorted(i for i, h in handles.items() if not isinstance(h, str))
        return {
            "driver": _call(nv, "nvmlSystemGetDriverVersion"),
            "cuda": _call(nv, "nvmlSystemGetCudaDriverVersion"),
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

    No pynvml, no driver, no GPU or a broken NVML all give a Topology (without GPUs where none
    could be read) and notes saying why, never an exception.
    """
    nv = nv if nv is not None else _import_pynvml()
    if nv is None:
        return Topology(gpus=(), source="nvml", notes=("nvidia-ml-py (pynvml) is not installed",))
    data = dump(nv)
    lost = (
        [f"NVML could not open {', '.join(data['unreadable'])}"] if data.get("unreadable") else []
    )
    try:
        topo = from_nvml_dump(data, source="nvml")
    except TopologyError as exc:  # every GPU's answers unusable: say so, plan without them
        topo = Topology(gpus=(), source="nvml", notes=(str(exc),))
    if not topo.gpus:
        found = "NVML found no GPU (no driver or no device)" if not data["gpus"] else None
        topo = replace(topo, notes=(*((found,) if found else ()), *topo.notes))
    return apply_visible_devices(replace(topo, notes=(*topo.notes, *lost)), env)


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
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None  # an ERR marker, or an answer of the wrong kind
    return float(value) * scale


def _field(value: Any, name: str, scale: float = 1.0) -> float | None:
    return None if isinstance(value, str) else _num(getattr(value, name, None), scale)


def _nvlink_bytes(nv: Any, h: Any) -> tuple[float | None, float | None]:
    fields = [(_FI_NVLINK_TX, _ALL_LINKS), (_FI_NVLINK_RX, _ALL_LINKS)]
    values = _call(nv, "nvmlDeviceGetFieldValues", h, fields)
    out: list[float | None] = [None, None]
    if isinstance(values, str):
        return None, None
    try:
        for n, v in enumerate(list(values)[:2]):
            # nvmlReturn per field: 0 is success; the counters are KiB.
            if int(v.nvmlReturn) == 0:
                out[n] = _num(v.value.ullVal, 1024.0)
    except (AttributeError, TypeError, ValueError):
        return None, None
    return out[0], out[1]


def _sample_one(nv: Any, i: int, h: Any) -> GpuSample:
    util = _call(nv, "nvmlDeviceGetUtilizationRates", h)
    mem = _call(nv, "nvmlDeviceGetMemoryInfo", h)
    tx, rx = _nvlink_bytes(nv, h)
    gpu = _field(util, "gpu")
    return GpuSample(
        index=i,
        name=str(_call(nv, "nvmlDeviceGetName", h)),
        uuid=str(_call(nv, "nvmlDeviceGetUUID", h)),
        utilization_ratio=None if gpu is None else gpu / 100.0,
        memory_used_bytes=_field(mem, "used"),
        memory_total_bytes=_field(mem, "total"),
        power_watts=_num(_call(nv, "nvmlDeviceGetPowerUsage", h), 1e-3),  # milliwatts
        # KB/s over NVML's 20 ms window.
        pcie_tx_bytes_per_second=_num(_call(nv, "nvmlDeviceGetPcieThroughput", h, 0), 1024.0),
        pcie_rx_bytes_per_second=_num(_call(nv, "nvmlDeviceGetPcieThroughput", h, 1), 1024.0),
        nvlink_tx_bytes_total=tx,
        nvlink_rx_bytes_total=rx,
    )


def sample_gpus(nv: Any = None) -> list[GpuSample]:
    """Counters of every GPU NVML sees (all of them: a metrics exporter ignores
    CUDA_VISIBLE_DEVICES); an empty list without NVML or GPUs. A GPU NVML cannot open is left
    out; a counter NVML refuses is None."""
    nv = nv if nv is not None else _import_pynvml()
    if nv is None:
        return []
    with session(nv) as ok:
        if not ok:
            return []
        handles = {i: _call(nv, "nvmlDeviceGetHandleByIndex", i) for i in range(_count(nv))}
        return [_sample_one(nv, i, h) for i, h in handles.items() if not isinstance(h, str)]
