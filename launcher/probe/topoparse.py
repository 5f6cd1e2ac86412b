"""Total readers for the two topology formats (docs/topology-format.md): any JSON value in, a
Topology or one TopologyError out, never another exception.

Where a value is missing, null, ``"ERR:..."`` (NVML refused) or of the wrong type it reads as
unknown (``None`` in the dataclass), and what the planner can only assume is said in a note:
which GPUs or pairs, what was unknown and why, and what is assumed instead. The assumptions about
values a Topology can hold as ``None`` are made in :func:`launcher.probe.topology.assumption_notes`;
the notes made here are about what a Topology cannot hold (a GPU list element that is no GPU, an
NVLink list NVML refused). An error is raised only when nothing usable is left: the top level is
not an object or has no GPU list.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from launcher.errors import TopologyError
from launcher.probe.gpuperf import GpuPerf, perf_from_json, perf_to_json
from launcher.probe.topotypes import (
    ANCESTOR_NAMES,
    ANCESTOR_RANK,
    FORMAT,
    P2P_FIELDS,
    P2P_STATUS_NAMES,
    Gpu,
    Measured,
    Pair,
    Topology,
    normalize_bus_id,
)

# A remote bus id NVML gives in VMs (and for links that end on an NVSwitch we cannot name).
_UNKNOWN_BUS = "FFFFFFFF:FF:FF.0"
_TRANSPORTS = ("nvlink", "p2p-pcie", "shm", "net")
_MISSING = object()
UNKNOWN_NAME = "unknown GPU"  # the name of a GPU whose name NVML did not give

# Plausible ranges: a value outside is a broken reading, not a machine (and a memory size of 1e40
# bytes would overflow the cost model's floats).
_MAX_INDEX = 4095
_MAX_MEMORY = 1 << 50  # 1 PiB
_MAX_PCIE_GEN = 16
_MAX_PCIE_WIDTH = 64
_MAX_LINKS = 64


class Notes:
    """Notes grouped by what they say, so eight GPUs that refused one call make one line."""

    def __init__(self) -> None:
        self._groups: dict[str, list[str]] = {}

    def add(self, subject: str, what: str) -> None:
        self._groups.setdefault(what, []).append(subject)

    def unknown(self, subject: str, what: str, raw: Any, assumed: str) -> None:
        """``subject``: ``what`` unknown (why ``raw`` says); ``assumed``."""
        self.add(subject, f"{what} unknown ({why(raw)}); {assumed}")

    def lines(self) -> tuple[str, ...]:
        return tuple(f"{', '.join(subjects)}: {what}" for what, subjects in self._groups.items())


def why(raw: Any) -> str:
    """Why a raw value counts as unknown, in a few words."""
    if raw is _MISSING:
        return "missing"
    if raw is None:
        return "null"
    if isinstance(raw, str) and raw.startswith("ERR:"):
        return f"NVML refused: {raw[4:] or 'error'}"
    text = repr(raw)
    return f"unreadable value {text if len(text) <= 40 else text[:37] + '...'}"


def _get(d: Mapping[str, Any], key: str) -> Any:
    return d.get(key, _MISSING)


def _absent(raw: Any) -> bool:
    """Missing, null or NVML's refusal: unknown, and said so by the dump's own convention."""
    return raw is _MISSING or raw is None or (isinstance(raw, str) and raw.startswith("ERR:"))


def _int(raw: Any, lo: int = 0, hi: int | None = None) -> int | None:
    """An integer in [lo, hi], or None. Whole floats count (16.0); bools and strings do not."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, float) and math.isfinite(raw) and raw.is_integer():
        raw = int(raw)
    if not isinstance(raw, int) or raw < lo or (hi is not None and raw > hi):
        return None
    return raw


def _float(raw: Any) -> float | None:
    """A finite non-negative number, or None."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    try:
        value = float(raw)
    except OverflowError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _str(raw: Any) -> str | None:
    return raw if isinstance(raw, str) and raw and not raw.startswith("ERR:") else None


def _items(raw: Any) -> list[Any] | None:
    """A JSON list (never a string, which is a Sequence too), or None."""
    return list(raw) if isinstance(raw, Sequence) and not isinstance(raw, (str, bytes)) else None


class _Reader:
    """One file's reading: the notes it makes and the checks both formats share."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.notes = Notes()

    def checked_int(
        self, subject: str, d: Mapping[str, Any], key: str, hi: int | None = None, lo: int = 0
    ) -> int | None:
        """An integer field; a present value that is no such integer is noted as unreadable."""
        raw = _get(d, key)
        value = _int(raw, lo, hi)
        if value is None and not _absent(raw):
            self.notes.unknown(subject, key, raw, "read as unknown")
        return value

    def gpu_list(self, data: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any]]]:
        """(index, entry) of each usable GPU entry; an error when entries exist but none is."""
        raw = _get(data, "gpus")
        items = _items(raw)
        if items is None:
            raise TopologyError(
                f"{self.source}: 'gpus' is {why(raw)}, not a list; expected a topology JSON or "
                "an NVML dump (see docs/topology-format.md)"
            )
        out: list[tuple[int, Mapping[str, Any]]] = []
        seen: set[int] = set()
        for n, g in enumerate(items):
            if not isinstance(g, Mapping):
                self.notes.add(f"gpus[{n}]", f"not a GPU object ({why(g)}); left out")
                continue
            index = _int(_get(g, "index"), 0, _MAX_INDEX)
            if index is None:
                self.notes.add(
                    f"gpus[{n}]", f"no usable index ({why(_get(g, 'index'))}); GPU left out"
                )
                continue
            if index in seen:
                self.notes.add(f"gpus[{n}]", f"repeats GPU index {index}; left out")
                continue
            seen.add(index)
            out.append((index, g))
        if items and not out:
            raise TopologyError(
                f"{self.source}: none of the {len(items)} entries of 'gpus' is a usable GPU "
                f"({'; '.join(self.notes.lines())}); see docs/topology-format.md for the fields"
            )
        return out

    def pair_list(
        self, data: Mapping[str, Any], indices: set[int]
    ) -> list[tuple[int, int, Mapping[str, Any]]]:
        raw = _get(data, "pairs")
        items = _items(raw)
        if items is None:
            if not _absent(raw) or len(indices) > 1:
                # Every pair then reads as unknown; assumption_notes says what that assumes.
                self.notes.add("pairs", f"not a list ({why(raw)}); every pair read as unknown")
            return []
        out: list[tuple[int, int, Mapping[str, Any]]] = []
        seen: set[tuple[int, int]] = set()
        for n, p in enumerate(items):
            if not isinstance(p, Mapping):
                self.notes.add(f"pairs[{n}]", f"not a pair object ({why(p)}); ignored")
                continue
            a, b = _int(_get(p, "a"), 0, _MAX_INDEX), _int(_get(p, "b"), 0, _MAX_INDEX)
            if a is None or b is None or a == b:
                self.notes.add(f"pairs[{n}]", "does not name two GPUs by index; ignored")
                continue
            a, b = min(a, b), max(a, b)
            if a not in indices or b not in indices:
                self.notes.add(f"pairs[{n}]", f"names GPU{a}-GPU{b}, not both in 'gpus'; ignored")
                continue
            if (a, b) in seen:
                self.notes.add(f"pairs[{n}]", f"repeats GPU{a}-GPU{b}; ignored")
                continue
            seen.add((a, b))
            out.append((a, b, p))
        return out

    def common(self, data: Mapping[str, Any]) -> tuple[str | None, int | None]:
        return _str(_get(data, "driver")), self.checked_int("topology", data, "cuda")


# ----------------------------------------------------------------------------- NVML dump


def _cc(raw: Any) -> tuple[int, int] | None:
    items = _items(raw)
    if items is None or len(items) != 2:
        return None
    major, minor = _int(items[0], 0, 99), _int(items[1], 0, 99)
    return None if major is None or minor is None else (major, minor)


def _dump_links(r: _Reader, index: int, g: Mapping[str, Any], several: bool) -> list[str] | None:
    """The remote bus of each active NVLink of one GPU; None where NVML gave no usable list."""
    raw = _get(g, "nvlinks")
    items = _items(raw)
    if items is None:
        if several:  # with one GPU there is no pair for NVLink to join
            r.notes.unknown(f"GPU{index}", "NVLink state", raw, "assumed no NVLink")
        return None
    out = []
    for ln in items:
        if isinstance(ln, Mapping) and _int(_get(ln, "active")) == 1:
            bus = _str(_get(ln, "remote_bus"))
            out.append(normalize_bus_id(bus) if bus else _UNKNOWN_BUS)
    return out[:_MAX_LINKS]


@dataclass(frozen=True)
class _Names:
    """The fields the two formats name apart (the rest they name alike)."""

    memory: str
    memory_used: str
    mig: str


_DUMP_NAMES = _Names("memory_total", "memory_used", "mig_mode")
_OWN_NAMES = _Names("memory_bytes", "memory_used_bytes", "mig_enabled")


def _gpu(
    r: _Reader,
    index: int,
    d: Mapping[str, Any],
    names: _Names,
    nvlinks_active: int,
    persistence_mode: bool | None,
) -> Gpu:
    """A GPU from the fields both formats read alike, and those ``names`` names for its own."""
    subject = f"GPU{index}"
    return Gpu(
        index=index,
        name=_str(_get(d, "name")) or UNKNOWN_NAME,
        uuid=_str(_get(d, "uuid")) or f"unknown-{index}",
        bus_id=normalize_bus_id(_str(_get(d, "bus_id")) or ""),
        memory_bytes=r.checked_int(subject, d, names.memory, _MAX_MEMORY) or 0,
        cc=_cc(_get(d, "cc")),
        pcie_gen_cur=r.checked_int(subject, d, "pcie_gen_cur", _MAX_PCIE_GEN, 1),
        pcie_gen_max=r.checked_int(subject, d, "pcie_gen_max", _MAX_PCIE_GEN, 1),
        pcie_width_cur=r.checked_int(subject, d, "pcie_width_cur", _MAX_PCIE_WIDTH, 1),
        pcie_width_max=r.checked_int(subject, d, "pcie_width_max", _MAX_PCIE_WIDTH, 1),
        numa_node=_int(_get(d, "numa_node"), 0, _MAX_INDEX),
        nvlinks_active=nvlinks_active,
        persistence_mode=persistence_mode,
        cpu_affinity=_str(_get(d, "cpu_affinity")),
        memory_used_bytes=r.checked_int(subject, d, names.memory_used, _MAX_MEMORY),
        mig_enabled=_mig(_get(d, names.mig)),
    )


def _mig(raw: Any) -> bool | None:
    """MIG on or off from the dump's [current, pending] (or a bare current mode) or our own
    format's boolean; None for anything else (refused, absent, unreadable)."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, list) and raw:
        raw = raw[0]
    mode = _int(raw, 0, 1)
    return None if mode is None else mode == 1


def _dump_gpu(r: _Reader, index: int, d: Mapping[str, Any], links: list[str] | None) -> Gpu:
    persistence = _int(_get(d, "persistence_mode"), 0, 1)
    on = None if persistence is None else persistence == 1
    return _gpu(r, index, d, _DUMP_NAMES, len(links or []), on)


def _status(raw: Any) -> str | None:
    v = _int(raw)
    return None if v is None else P2P_STATUS_NAMES.get(v, "UNKNOWN")


def _links_between(
    links: Mapping[int, list[str] | None], gpus: Mapping[int, Gpu], a: int, b: int, nvl_ok: bool
) -> int:
    """Active NVLinks joining a and b.

    A link whose remote bus is b's counts directly (a bridge between two cards). Links that end on
    something else (an NVSwitch) or on a bus NVML hides (VMs print FFFFFFFF:FF:FF.0) join a and b
    only when NVML says P2P over NVLink is OK between them; then the pair gets as many as the
    smaller side has, which is what `nvidia-smi topo -m` shows as NV# on NVSwitch machines.
    """
    bus_ids = {g.bus_id for g in gpus.values()}
    la, lb = links.get(a) or [], links.get(b) or []
    direct = sum(1 for r in la if r == gpus[b].bus_id)
    if direct:
        return direct
    if not nvl_ok:
        return 0
    return min(sum(1 for r in la if r not in bus_ids), sum(1 for r in lb if r not in bus_ids))


def from_nvml_dump(data: Any, source: str = "nvml") -> Topology:
    """The plain NVML dump (raw NVML codes, ``"ERR:..."`` where NVML refused), read totally."""
    if not isinstance(data, Mapping):
        raise TopologyError(f"{source}: not a JSON object; expected an NVML dump")
    r = _Reader(source)
    raw_gpus = dict(r.gpu_list(data))
    several = len(raw_gpus) > 1
    links = {i: _dump_links(r, i, g, several) for i, g in raw_gpus.items()}
    gpus = {i: _dump_gpu(r, i, g, links[i]) for i, g in raw_gpus.items()}
    pairs = []
    for a, b, p in r.pair_list(data, set(gpus)):
        statuses = {f: _status(_get(p, f)) for f in P2P_FIELDS}
        anc = _int(_get(p, "common_ancestor"))
        pairs.append(
            Pair(
                a=a,
                b=b,
                nvlinks=_links_between(links, gpus, a, b, statuses["p2p_nvlink"] == "OK"),
                common_ancestor=None if anc is None else ANCESTOR_NAMES.get(anc),
                p2p_read=statuses["p2p_read"],
                p2p_write=statuses["p2p_write"],
                p2p_nvlink=statuses["p2p_nvlink"],
                p2p_atomics=statuses["p2p_atomics"],
                p2p_pci=statuses["p2p_pci"],
            )
        )
    driver, cuda = r.common(data)
    return Topology(
        gpus=tuple(gpus[i] for i in sorted(gpus)),
        pairs=tuple(sorted(pairs, key=lambda q: (q.a, q.b))),
        driver=driver,
        cuda=cuda,
        source=source,
        notes=r.notes.lines(),
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
        **({"host_available_bytes": topo.host_available_bytes}
           if topo.host_available_bytes is not None else {}),
        "gpus": [
            {
                **{k: v for k, v in vars(g).items() if k != "perf"},
                "cc": list(g.cc) if g.cc else None,
                "measured": perf_to_json(g.perf),
            }
            for g in topo.gpus
        ],
        "pairs": [
            {
                **{
                    k: v
                    for k, v in vars(p).items()
                    if k not in ("measured", "p2p_disabled_by_env")  # a fact of one run
                },
                "measured": measured(p.measured),
            }
            for p in topo.pairs
        ],
    }


def _name(raw: Any, names: Sequence[str]) -> str | None:
    return raw if isinstance(raw, str) and raw in names else None


def _checked_name(r: _Reader, subject: str, d: Mapping[str, Any], key: str, names: Any) -> Any:
    raw = _get(d, key)
    value = _name(raw, tuple(names))
    if value is None and not _absent(raw):
        r.notes.unknown(subject, key, raw, "read as unknown")
    return value


def _project_gpu(r: _Reader, index: int, d: Mapping[str, Any]) -> Gpu:
    subject = f"GPU{index}"
    persistence = _get(d, "persistence_mode")
    nvlinks = r.checked_int(subject, d, "nvlinks_active", _MAX_LINKS)
    on = persistence if isinstance(persistence, bool) else None
    gpu = _gpu(r, index, d, _OWN_NAMES, nvlinks or 0, on)
    # read after the other fields, so that its notes follow theirs as they always have
    return replace(gpu, perf=_perf(r, subject, d))


def _perf(r: _Reader, subject: str, d: Mapping[str, Any]) -> GpuPerf | None:
    """The GPU's measured GEMM rates (optional; what cannot be used is ignored, with a note)."""
    raw = _get(d, "measured")
    perf, reasons = perf_from_json(None if raw is _MISSING else raw)
    for reason in reasons:
        r.notes.add(subject, reason)
    if perf is not None:
        r.notes.add(subject, f"planned from figures measured on it ({perf.describe()}), not "
                    "the datasheet table")
    return perf


def _measured(raw: Any) -> Measured | None:
    if not isinstance(raw, Mapping):
        return None
    ok = _get(raw, "allreduce_ok")
    return Measured(
        bandwidth_gbs=_float(_get(raw, "bandwidth_gbs")),
        allreduce_gbs=_float(_get(raw, "allreduce_gbs")),
        latency_us=_float(_get(raw, "latency_us")),
        nccl_transport=_name(_get(raw, "nccl_transport"), _TRANSPORTS),
        allreduce_ok=ok if isinstance(ok, bool) else None,
    )


def _project_pair(r: _Reader, a: int, b: int, p: Mapping[str, Any]) -> Pair:
    subject = f"GPU{a}-GPU{b}"
    nvlinks = r.checked_int(subject, p, "nvlinks", _MAX_LINKS)
    if nvlinks is None:
        r.notes.unknown(subject, "NVLink count", _get(p, "nvlinks"), "assumed no NVLink")
    ancestors = [n for n in ANCESTOR_RANK if n != "X"]
    statuses = {f: _checked_name(r, subject, p, f, P2P_STATUS_NAMES.values()) for f in P2P_FIELDS}
    return Pair(
        a=a,
        b=b,
        nvlinks=nvlinks or 0,
        common_ancestor=_checked_name(r, subject, p, "common_ancestor", ancestors),
        measured=_measured(_get(p, "measured")),
        p2p_read=statuses["p2p_read"],
        p2p_write=statuses["p2p_write"],
        p2p_nvlink=statuses["p2p_nvlink"],
        p2p_atomics=statuses["p2p_atomics"],
        p2p_pci=statuses["p2p_pci"],
    )


def _from_project_json(data: Mapping[str, Any], source: str) -> Topology:
    r = _Reader(source)
    gpus = [_project_gpu(r, i, g) for i, g in r.gpu_list(data)]
    pairs = [_project_pair(r, a, b, p) for a, b, p in r.pair_list(data, {g.index for g in gpus})]
    saved = _items(_get(data, "notes")) or []
    driver, cuda = r.common(data)
    host = r.checked_int("host", data, "host_available_bytes", _MAX_MEMORY)
    return Topology(
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        pairs=tuple(sorted(pairs, key=lambda q: (q.a, q.b))),
        driver=driver,
        cuda=cuda,
        source=source,
        notes=(*(n for n in saved if isinstance(n, str)), *r.notes.lines()),
        host_available_bytes=host,
    )


def topology_from_json(data: Any, source: str = "json") -> Topology:
    """Either format, told apart by the ``format`` key the project's JSON always carries."""
    if not isinstance(data, Mapping):
        raise TopologyError(
            f"{source}: not a JSON object; expected a topology JSON or an NVML dump "
            "(see docs/topology-format.md)"
        )
    if "gpus" not in data:
        raise TopologyError(f"{source}: no 'gpus' list; expected a topology JSON or an NVML dump")
    fmt = data.get("format", _MISSING)
    if fmt == FORMAT:
        return _from_project_json(data, source)
    if fmt is not _MISSING:
        raise TopologyError(
            f"{source}: unknown topology format {str(fmt)[:60]!r}; expected {FORMAT}"
        )
    return from_nvml_dump(data, source)
