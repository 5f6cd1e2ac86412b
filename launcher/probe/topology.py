"""GPU topology as frozen values: what the GPUs are and how each pair is joined.

A Topology comes from NVML (:mod:`launcher.probe.nvml`) or from a saved file, read by the total
readers
of :mod:`launcher.probe.topoparse` (the values are in :mod:`launcher.probe.topotypes`). Two formats
load:

- the project's own JSON (``"format": "toposerve-topology/1"``, written by ``probe --save``;
  see docs/topology-format.md), and
- the plain NVML dump (docs/topology-format.md, tests/fixtures/topologies/*.nvml.json: raw NVML
  numbers, with ``"ERR:<exception>"`` where NVML refused), which :mod:`launcher.probe.nvml` also
  produces itself, so both readings go through one parser.

``Gpu.index`` is the NVML index, which is the CUDA index under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``;
the renderer always sets that order, so a plan's GPU indices mean the same thing everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Literal, get_args

from launcher.errors import TopologyError
from launcher.probe.topoparse import (
    UNKNOWN_NAME,
    Notes,
    from_nvml_dump,
    topology_from_json,
    topology_to_json,
)
from launcher.probe.topotypes import (
    ANCESTOR_NAMES,
    ANCESTOR_RANK,
    ASSUMED_PCIE_GEN,
    ASSUMED_PCIE_WIDTH,
    FORMAT,
    P2P_FIELDS,
    P2P_STATUS_NAMES,
    Gpu,
    Measured,
    Pair,
    Topology,
    normalize_bus_id,
)
from launcher.probe.visible import apply_visible_devices, visible_gpus
from topocommon import jsontext

__all__ = [
    "ANCESTOR_NAMES",
    "ANCESTOR_RANK",
    "ASSUMED_PCIE_GEN",
    "ASSUMED_PCIE_WIDTH",
    "FORMAT",
    "P2P_FIELDS",
    "P2P_STATUS_NAMES",
    "Gpu",
    "Measured",
    "Pair",
    "Topology",
    "apply_nccl_env",
    "apply_visible_devices",
    "assumption_notes",
    "from_nvml_dump",
    "host_available_bytes",
    "load_topology",
    "normalize_bus_id",
    "pair_link",
    "pcie_link_name",
    "topology_from_json",
    "topology_to_json",
    "visible_gpus",
]


def load_topology(path: str | None, env: Mapping[str, str]) -> Topology:
    """A saved topology (``path``) or, with ``None``, this machine's GPUs read through NVML.

    ``CUDA_VISIBLE_DEVICES`` in ``env`` narrows both to the GPUs a process would see. Whatever
    the reading left unknown is said in the notes, with what the planner assumes instead.
    """
    if path is None:
        from launcher.probe import nvml  # NVML only when asked: plan --topology must run anywhere

        topo = replace(apply_nccl_env(nvml.read_topology(env), env),
                       host_available_bytes=host_available_bytes())
    else:
        topo = apply_nccl_env(apply_visible_devices(_read_file(path), env), env)
    return replace(topo, notes=tuple(dict.fromkeys((*topo.notes, *assumption_notes(topo)))))


def host_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The kernel's MemAvailable (what can be taken without swapping); None where unreadable."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    match = re.search(r"^MemAvailable:\s+(\d+) kB$", text, re.M)
    return int(match.group(1)) * 1024 if match else None


def _read_file(path: str) -> Topology:
    try:
        data = jsontext.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise TopologyError(
            f"topology file {path} not found; save one with `launcher probe --save FILE`"
        ) from exc
    except OSError as exc:
        raise TopologyError(f"cannot read topology file {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, jsontext.NestedTooDeep
        if _looks_like_topo_matrix(path):
            raise TopologyError(
                f"{path} is `nvidia-smi topo -m` output, which names neither the GPU models nor "
                "their memory; on that machine run `launcher probe --save FILE` and pass FILE"
            ) from exc
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TopologyError(f"cannot read topology file {path}: not JSON ({first})") from exc
    return topology_from_json(data, source=str(path))


def _looks_like_topo_matrix(path: str) -> bool:
    """The matrix `nvidia-smi topo -m` prints: a header row of GPU columns, then GPU rows."""
    try:
        head = Path(path).read_bytes()[:4096].decode("utf-8", "replace").split("\n")[:3]
    except OSError:
        return False
    cells = [line.split() for line in head]
    return len(cells) >= 2 and cells[0][:1] == ["GPU0"] and cells[1][:2] == ["GPU0", "X"]


def assumption_notes(topo: Topology) -> tuple[str, ...]:
    """What the planner assumes where the topology is unknown, one note per kind of unknown.

    Each assumption is the slow case (docs/topology-format.md): an unknown link is no NVLink and
    no P2P (NCCL through host memory), across sockets; an unknown PCIe link is x4 Gen3; a card of
    unknown memory holds nothing. The cost model makes the same assumptions from the ``None``s.
    """
    notes = Notes()
    for g in topo.gpus:
        if g.memory_bytes <= 0:
            notes.add(f"GPU{g.index}", "memory size unknown; assumed unusable (nothing on it)")
        if g.name == UNKNOWN_NAME and g.cc is None:
            notes.add(
                f"GPU{g.index}",
                "GPU model unknown (no name, no compute capability); assumed a generic card",
            )
    pairs = {(p.a, p.b): p for p in topo.pairs}
    over_pcie: set[int] = set()
    for i, ga in enumerate(topo.gpus):
        for gb in topo.gpus[i + 1 :]:
            a, b = sorted((ga.index, gb.index))
            p = pairs.get((a, b))
            subject = f"GPU{a}-GPU{b}"
            if p is None:
                notes.add(
                    subject,
                    "no entry in 'pairs'; assumed no NVLink and no P2P (NCCL through host memory), "
                    "across sockets",
                )
                over_pcie |= {a, b}
                continue
            if (p.measured is not None and p.measured.nccl_transport) or pair_link(p) == "nvlink":
                continue
            over_pcie |= {a, b}
            if p.p2p_disabled_by_env:
                continue
            if p.p2p_read is None or p.p2p_write is None:
                notes.add(subject, "P2P status unknown; assumed no P2P (NCCL through host memory)")
            if p.common_ancestor is None:
                notes.add(subject, "PCIe path unknown; assumed across CPU sockets (SYS)")
    for g in topo.gpus:
        if g.index not in over_pcie:
            continue
        if g.pcie_width_cur is None:
            width = min(g.pcie_width_max or ASSUMED_PCIE_WIDTH, ASSUMED_PCIE_WIDTH)
            notes.add(f"GPU{g.index}", f"PCIe link width unknown; assumed x{width}")
        if g.pcie_gen_max is None and g.pcie_gen_cur is None:
            notes.add(f"GPU{g.index}", f"PCIe generation unknown; assumed Gen{ASSUMED_PCIE_GEN}")
    return notes.lines()


def apply_nccl_env(topo: Topology, env: Mapping[str, str]) -> Topology:
    """Plan for the transport NCCL will use under ``env``.

    With NCCL_P2P_DISABLE set, NCCL joins every pair through host memory even over NVLink (on
    the lent H200s its log then said ``via SHM/direct/direct`` and TP=2 prefill fell by a third).
    A link measured over P2P no longer says what will run, so that measurement is dropped.
    """
    if env.get("NCCL_P2P_DISABLE", "0") in ("", "0") or not topo.pairs:
        return topo
    pairs = tuple(
        replace(
            p,
            p2p_disabled_by_env=True,
            measured=p.measured
            if p.measured is not None and p.measured.nccl_transport == "shm"
            else None,
        )
        for p in topo.pairs
    )
    note = (
        "NCCL_P2P_DISABLE is set: NCCL will join the GPUs through host memory (SHM), NVLink and"
        " P2P unused; planned accordingly (unset it to use them)"
    )
    return replace(topo, pairs=pairs, notes=(*topo.notes, note))


# ------------------------------------------------------------------------------- link summaries


def pcie_link_name(g: Gpu) -> str:
    gen = f"Gen{g.pcie_gen_cur}" if g.pcie_gen_cur else "Gen?"
    width = f"x{g.pcie_width_cur}" if g.pcie_width_cur else "x?"
    return f"{gen} {width}"


# How NCCL joins GPUs: the planner's link names ("none": one GPU, or the CPU engine).
Transport = Literal["nvlink", "p2p-pcie", "shm", "net", "none"]
TRANSPORTS: tuple[Transport, ...] = get_args(Transport)
_TRANSPORT_NAMED: dict[str, Transport] = {t: t for t in TRANSPORTS}


def transport_named(name: str) -> Transport | None:
    """The transport ``name`` is (None for any other text): where a name is read from outside."""
    return _TRANSPORT_NAMED.get(name)


def pair_link(p: Pair) -> Transport:
    """How NCCL would join the pair, assumed from NVML (measured transport wins when present)."""
    measured = transport_named(p.measured.nccl_transport or "") if p.measured else None
    if measured is not None:  # the topology reader took only these names (topoparse)
        return measured
    if p.p2p_disabled_by_env:
        return "shm"
    if p.nvlinks > 0 and p.p2p_nvlink in ("OK", None):
        return "nvlink"
    if p.p2p_ok:
        return "p2p-pcie"
    return "shm"
