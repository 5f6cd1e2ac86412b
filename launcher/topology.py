"""GPU topology as frozen values: what the GPUs are and how each pair is joined.

A Topology comes from NVML (:mod:`launcher.nvml`) or from a saved file. Two file formats load:

- the project's own JSON (``"format": "toposerve-topology/1"``, written by ``probe --save``;
  see docs/topology-format.md), and
- the plain NVML dump (docs/topology-format.md, tests/fixtures/topologies/*.nvml.json: raw NVML
  numbers, with ``"ERR:<exception>"`` where NVML refused), which :mod:`launcher.nvml` also
  produces itself, so both readings go through one parser.

``Gpu.index`` is the NVML index, which is the CUDA index under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``;
the renderer always sets that order, so a plan's GPU indices mean the same thing everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from launcher.errors import TopologyError

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

# A remote bus id NVML gives in VMs (and for links that end on an NVSwitch we cannot name).
_UNKNOWN_BUS = "FFFFFFFF:FF:FF.0"


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


# ----------------------------------------------------------------------------- NVML dump parsing


def _val(raw: Any) -> Any:
    """A dump value, or None where NVML refused ("ERR:...")."""
    if isinstance(raw, str) and raw.startswith("ERR:"):
        return None
    return raw


def _int(raw: Any) -> int | None:
    v = _val(raw)
    if v is None or isinstance(v, bool):
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def normalize_bus_id(bus: str) -> str:
    """``0000:01:00.0`` and ``00000000:01:00.0`` are one device: upper-case, 8-digit domain."""
    bus = bus.strip().upper()
    domain, sep, rest = bus.partition(":")
    if not sep:
        return bus
    return f"{int(domain, 16):08X}:{rest}" if domain else bus


def _gpu_from_dump(d: Mapping[str, Any]) -> Gpu:
    cc_raw = _val(d.get("cc"))
    cc = (
        (int(cc_raw[0]), int(cc_raw[1]))
        if isinstance(cc_raw, Sequence) and len(cc_raw) == 2
        else None
    )
    links = [ln for ln in d.get("nvlinks") or [] if isinstance(ln, Mapping)]
    persistence = _int(d.get("persistence_mode"))
    affinity = _val(d.get("cpu_affinity"))
    return Gpu(
        index=int(d["index"]),
        name=str(_val(d.get("name")) or "unknown GPU"),
        uuid=str(_val(d.get("uuid")) or f"unknown-{d['index']}"),
        bus_id=normalize_bus_id(str(_val(d.get("bus_id")) or "")),
        memory_bytes=_int(d.get("memory_total")) or 0,
        cc=cc,
        pcie_gen_cur=_int(d.get("pcie_gen_cur")),
        pcie_gen_max=_int(d.get("pcie_gen_max")),
        pcie_width_cur=_int(d.get("pcie_width_cur")),
        pcie_width_max=_int(d.get("pcie_width_max")),
        numa_node=_int(d.get("numa_node")),
        nvlinks_active=sum(1 for ln in links if _int(ln.get("active")) == 1),
        persistence_mode=None if persistence is None else persistence == 1,
        cpu_affinity=str(affinity) if affinity else None,
    )


def _links_between(
    raw_gpus: Mapping[int, Mapping[str, Any]], gpus: Mapping[int, Gpu], a: int, b: int, nvl_ok: bool
) -> int:
    """Active NVLinks joining a and b.

    A link whose remote bus is b's counts directly (a bridge between two cards). Links that end on
    something else (an NVSwitch) or on a bus NVML hides (VMs print FFFFFFFF:FF:FF.0) join a and b
    only when NVML says P2P over NVLink is OK between them; then the pair gets as many as the
    smaller side has, which is what `nvidia-smi topo -m` shows as NV# on NVSwitch machines.
    """
    bus_ids = {normalize_bus_id(g.bus_id) for g in gpus.values()}

    def active(i: int) -> list[str]:
        out = []
        for ln in raw_gpus[i].get("nvlinks") or []:
            if _int(ln.get("active")) == 1:
                out.append(normalize_bus_id(str(_val(ln.get("remote_bus")) or _UNKNOWN_BUS)))
        return out

    direct = sum(1 for r in active(a) if r == normalize_bus_id(gpus[b].bus_id))
    if direct:
        return direct
    if not nvl_ok:
        return 0
    elsewhere_a = sum(1 for r in active(a) if r not in bus_ids)
    elsewhere_b = sum(1 for r in active(b) if r not in bus_ids)
    return min(elsewhere_a, elsewhere_b)


def _status(raw: Any) -> str | None:
    v = _int(raw)
    return None if v is None else P2P_STATUS_NAMES.get(v, "UNKNOWN")


def from_nvml_dump(data: Mapping[str, Any], source: str = "nvml") -> Topology:
    """Parse the plain NVML dump format (see docs/topology-format.md)."""
    try:
        raw_gpus = {int(g["index"]): g for g in data.get("gpus", [])}
        gpus = {i: _gpu_from_dump(g) for i, g in raw_gpus.items()}
        pairs = []
        for p in data.get("pairs", []):
            a, b = sorted((int(p["a"]), int(p["b"])))
            statuses = {f: _status(p.get(f)) for f in P2P_FIELDS}
            anc = _int(p.get("common_ancestor"))
            nvl_ok = statuses["p2p_nvlink"] == "OK"
            pairs.append(
                Pair(
                    a=a,
                    b=b,
                    nvlinks=_links_between(raw_gpus, gpus, a, b, nvl_ok),
                    common_ancestor=None if anc is None else ANCESTOR_NAMES.get(anc),
                    p2p_read=statuses["p2p_read"],
                    p2p_write=statuses["p2p_write"],
                    p2p_nvlink=statuses["p2p_nvlink"],
                    p2p_atomics=statuses["p2p_atomics"],
                    p2p_pci=statuses["p2p_pci"],
                )
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise TopologyError(
            f"{source}: not a usable NVML dump ({type(exc).__name__}: {exc}); "
            "see docs/topology-format.md for the fields"
        ) from exc
    driver = _val(data.get("driver"))
    return Topology(
        gpus=tuple(gpus[i] for i in sorted(gpus)),
        pairs=tuple(sorted(pairs, key=lambda q: (q.a, q.b))),
        driver=str(driver) if driver else None,
        cuda=_int(data.get("cuda")),
        source=source,
    )


# ------------------------------------------------------------------------ the project's own JSON


def topology_to_json(topo: Topology) -> dict[str, Any]:
    def measured(m: Measured | None) -> dict[str, Any] | None:
        return None if m is None else dict(vars(m))

    return {
        "format": FORMAT,
        "source": topo.source,
        "driver": topo.driver,
        "cuda": topo.cuda,
        "notes": list(topo.notes),
        "gpus": [{**vars(g), "cc": list(g.cc) if g.cc else None} for g in topo.gpus],
        "pairs": [
            {
                **{k: v for k, v in vars(p).items() if k != "measured"},
                "measured": measured(p.measured),
            }
            for p in topo.pairs
        ],
    }


def _from_project_json(data: Mapping[str, Any], source: str) -> Topology:
    try:
        gpus = []
        for g in data["gpus"]:
            fields = dict(g)
            fields["cc"] = tuple(fields["cc"]) if fields.get("cc") else None
            gpus.append(Gpu(**fields))
        pairs = []
        for p in data.get("pairs", []):
            fields = dict(p)
            m = fields.pop("measured", None)
            pairs.append(Pair(**fields, measured=Measured(**m) if m else None))
    except (KeyError, TypeError) as exc:
        raise TopologyError(
            f"{source}: not a usable toposerve topology ({exc}); see docs/topology-format.md"
        ) from exc
    return Topology(
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        pairs=tuple(sorted(pairs, key=lambda q: (q.a, q.b))),
        driver=data.get("driver"),
        cuda=data.get("cuda"),
        source=source,
        notes=tuple(data.get("notes", ())),
    )


def topology_from_json(data: Mapping[str, Any], source: str = "json") -> Topology:
    """Either format, told apart by the ``format`` key the project's JSON always carries."""
    if not isinstance(data, Mapping) or "gpus" not in data:
        raise TopologyError(f"{source}: no 'gpus' list; expected a topology JSON or an NVML dump")
    if data.get("format") == FORMAT:
        return _from_project_json(data, source)
    if "format" in data:
        raise TopologyError(
            f"{source}: unknown topology format {data['format']!r}; expected {FORMAT}"
        )
    return from_nvml_dump(data, source)


def load_topology(path: str | None, env: Mapping[str, str]) -> Topology:
    """A saved topology (``path``) or, with ``None``, this machine's GPUs read through NVML.

    ``CUDA_VISIBLE_DEVICES`` in ``env`` narrows both to the GPUs a process would see.
    """
    if path is None:
        from launcher import nvml  # NVML only when asked: plan --topology must run anywhere

        return apply_nccl_env(nvml.read_topology(env), env)
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError as exc:
        raise TopologyError(
            f"topology file {path} not found; save one with `launcher probe --save FILE`"
        ) from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise TopologyError(f"cannot read topology file {path}: {exc}") from exc
    topo = apply_visible_devices(topology_from_json(data, source=str(path)), env)
    return apply_nccl_env(topo, env)


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


# ------------------------------------------------------------------- CUDA_VISIBLE_DEVICES mapping


def _cuda_order(gpus: Sequence[Gpu], env: Mapping[str, str]) -> list[Gpu]:
    """GPUs in the order CUDA numbers them under ``env``.

    NVML numbers by PCI bus. CUDA does so only with CUDA_DEVICE_ORDER=PCI_BUS_ID; its default
    FASTEST_FIRST puts the newest compute capability first (ties by bus), which we imitate.
    """
    by_bus = sorted(gpus, key=lambda g: g.index)
    if env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") == "PCI_BUS_ID":
        return by_bus
    return sorted(by_bus, key=lambda g: (-(g.cc or (0, 0))[0], -(g.cc or (0, 0))[1]))


def visible_gpus(gpus: Sequence[Gpu], env: Mapping[str, str]) -> tuple[list[Gpu], list[str]]:
    """The GPUs CUDA_VISIBLE_DEVICES selects, in its order, and notes about what was dropped.

    Entries are CUDA indices (numbered as :func:`_cuda_order` says), or UUIDs / unique UUID
    prefixes (``GPU-8a1f``). Like CUDA, parsing stops at the first entry that names no device.
    """
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return list(gpus), []
    ordered = _cuda_order(gpus, env)
    chosen: list[Gpu] = []
    for entry in (e.strip() for e in cvd.split(",")):
        found = _match_entry(entry, ordered)
        if found is None or found in chosen:
            return chosen, [
                f"CUDA_VISIBLE_DEVICES={cvd!r}: entry {entry!r} names no GPU; "
                "CUDA ignores it and every entry after it"
            ]
        chosen.append(found)
    return chosen, []


def _match_entry(entry: str, ordered: Sequence[Gpu]) -> Gpu | None:
    if entry.lstrip("-").isdigit():
        i = int(entry)
        return ordered[i] if 0 <= i < len(ordered) else None
    matches = [g for g in ordered if g.uuid.upper().startswith(entry.upper()) and entry]
    return matches[0] if len(matches) == 1 else None


def apply_visible_devices(topo: Topology, env: Mapping[str, str]) -> Topology:
    """Keep the GPUs (and pairs) that ``CUDA_VISIBLE_DEVICES`` in ``env`` lets a process see."""
    if "CUDA_VISIBLE_DEVICES" not in env:
        return topo
    kept, notes = visible_gpus(topo.gpus, env)
    keep = {g.index for g in kept}
    note = f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r} keeps GPUs {sorted(keep)}"
    return replace(
        topo,
        gpus=tuple(g for g in topo.gpus if g.index in keep),
        pairs=tuple(p for p in topo.pairs if p.a in keep and p.b in keep),
        notes=(*topo.notes, note, *notes),
    )


# ------------------------------------------------------------------------------- link summaries


def pcie_link_name(g: Gpu) -> str:
    gen = f"Gen{g.pcie_gen_cur}" if g.pcie_gen_cur else "Gen?"
    width = f"x{g.pcie_width_cur}" if g.pcie_width_cur else "x?"
    return f"{gen} {width}"


def pair_link(p: Pair) -> str:
    """How NCCL would join the pair, assumed from NVML (measured transport wins when present)."""
    if p.measured is not None and p.measured.nccl_transport:
        return p.measured.nccl_transport
    if p.p2p_disabled_by_env:
        return "shm"
    if p.nvlinks > 0 and p.p2p_nvlink in ("OK", None):
        return "nvlink"
    if p.p2p_ok:
        return "p2p-pcie"
    return "shm"
