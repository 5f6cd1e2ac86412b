"""The one module that talks to NVML (``pynvml`` from nvidia-ml-py).

Every call goes through :func:`topocommon.nvml.call`, which turns any exception of the call
(``NVMLError``:
NotSupported on GeForce cards, NoPermission in containers, ...; also a function an old
nvidia-ml-py lacks, or a binding that fails some other way) into the dump's ``"ERR:<name>"``
marker, and every answer is checked for the shape it should have before it is used, so a broken
NVML makes an unknown, never an exception. The pynvml module is a parameter everywhere, so tests
drive this code with a stand-in module on machines without a GPU.

The reading is a plain NVML dump (docs/topology-format.md; tests/fixtures/topologies/*.nvml.json),
parsed by :func:`launcher.probe.topoparse.from_nvml_dump`: a live machine and a saved dump take one
path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from launcher.errors import TopologyError
from launcher.probe.topoparse import from_nvml_dump
from launcher.probe.topotypes import Topology
from launcher.probe.visible import apply_visible_devices
from topocommon.nvml import call, count, err, import_pynvml, session

# NVML_P2P_CAPS_INDEX_READ is the tuple (0,) in nvidia-ml-py (a stray comma), so the integers are
# spelled out here: read, write, nvlink, atomics, pci.
P2P_CAPS = {"p2p_read": 0, "p2p_write": 1, "p2p_nvlink": 2, "p2p_atomics": 3, "p2p_pci": 4}
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS is 18 up to Hopper; asking beyond raises, caught.



def _bus(info: Any) -> Any:
    """The ``busId`` of an nvmlPciInfo_t (bytes in older bindings), or an ERR marker."""
    if isinstance(info, str):
        return info
    bus = getattr(info, "busId", None)
    if isinstance(bus, bytes):
        return bus.decode(errors="replace")
    return bus if isinstance(bus, str) else "ERR:NoBusId"


def _cpu_affinity(nv: Any, h: Any) -> Any:
    words = call(nv, "nvmlDeviceGetCpuAffinity", h, 4)  # 4 × 64 bits: up to 256 CPUs
    if isinstance(words, str):
        return words
    try:
        masks = [int(word) for word in words]
    except (TypeError, ValueError, OverflowError) as exc:
        return err(exc)
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
        state = call(nv, "nvmlDeviceGetNvLinkState", h, link)
        if isinstance(state, str):  # NotSupported / InvalidArgument: no such link
            continue
        remote = call(nv, "nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        links.append({"link": link, "active": state, "remote_bus": _bus(remote)})
    return links


def _dump_gpu(nv: Any, i: int, h: Any) -> dict[str, Any]:
    def ask(fn: str) -> Any:
        return call(nv, fn, h)

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
        "common_ancestor": call(nv, "nvmlDeviceGetTopologyCommonAncestor", ha, hb),
    }
    for name, cap in P2P_CAPS.items():
        pair[name] = call(nv, "nvmlDeviceGetP2PStatus", ha, hb, cap)
    return pair


def dump(nv: Any) -> dict[str, Any]:
    """This machine's GPUs in the plain NVML dump format; ``{"gpus": []}`` without NVML.

    Indices are NVML's (PCI bus order); CUDA_VISIBLE_DEVICES is applied afterwards.
    """
    with session(nv) as ok:
        if not ok:
            return {"driver": None, "cuda": None, "gpus": [], "pairs": []}
        # A GPU NVML cannot open (lost, no permission) is left out rather than sinking the rest.
        handles = {i: call(nv, "nvmlDeviceGetHandleByIndex", i) for i in range(count(nv))}
        readable = sorted(i for i, h in handles.items() if not isinstance(h, str))
        return {
            "driver": call(nv, "nvmlSystemGetDriverVersion"),
            "cuda": call(nv, "nvmlSystemGetCudaDriverVersion"),
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
    nv = nv if nv is not None else import_pynvml()
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
