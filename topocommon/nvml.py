"""NVML for every package: the guarded call, the session, and live GPU samples.

Every call goes through :func:`call`, which turns any exception of the call (``NVMLError``:
NotSupported on GeForce cards, NoPermission in containers, ...; also a function an old
nvidia-ml-py lacks, or a binding that fails some other way) into an ``"ERR:<name>"`` marker, so a
broken NVML makes an unknown, never an exception. The pynvml module is a parameter everywhere, so
tests drive this code with a stand-in module on machines without a GPU.

The launcher's probe reads the topology through these calls (launcher.probe.nvml); the proxy's
``/metrics`` and its GPU sampler read :func:`sample_gpus`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_ALL_LINKS = 0xFFFFFFFF  # field-value scope meaning "summed over every link"
_FI_NVLINK_TX, _FI_NVLINK_RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}, KiB


def import_pynvml() -> Any:
    try:
        import pynvml
    except Exception:  # not installed, or a broken install: no NVML either way
        return None
    return pynvml


def err(exc: BaseException) -> str:
    return f"ERR:{type(exc).__name__}"


def call(nv: Any, fn: str, *args: Any) -> Any:
    """``nv.<fn>(*args)``, or ``"ERR:<exception>"`` when it raises (or does not exist).

    Any exception, not only NVMLError: the bindings are ctypes over a driver library this process
    does not control, and a missing or misbehaving call must cost one value, not the probe.
    """
    try:
        value = getattr(nv, fn)(*args)
    except Exception as exc:  # any: see the docstring
        return err(exc)
    return value.decode(errors="replace") if isinstance(value, bytes) else value


@contextlib.contextmanager
def session(nv: Any) -> Iterator[bool]:
    """nvmlInit/nvmlShutdown; yields False (no exception) when there is no driver or library."""
    if isinstance(call(nv, "nvmlInit"), str):
        yield False
        return
    try:
        yield True
    finally:
        call(nv, "nvmlShutdown")


def count(nv: Any) -> int:
    """How many GPUs NVML has; 0 when it cannot say (a count above 4096 is no real answer)."""
    count = call(nv, "nvmlDeviceGetCount")
    return (
        count
        if isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= 4096
        else 0
    )


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
    values = call(nv, "nvmlDeviceGetFieldValues", h, fields)
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
    util = call(nv, "nvmlDeviceGetUtilizationRates", h)
    mem = call(nv, "nvmlDeviceGetMemoryInfo", h)
    tx, rx = _nvlink_bytes(nv, h)
    gpu = _field(util, "gpu")
    return GpuSample(
        index=i,
        name=str(call(nv, "nvmlDeviceGetName", h)),
        uuid=str(call(nv, "nvmlDeviceGetUUID", h)),
        utilization_ratio=None if gpu is None else gpu / 100.0,
        memory_used_bytes=_field(mem, "used"),
        memory_total_bytes=_field(mem, "total"),
        power_watts=_num(call(nv, "nvmlDeviceGetPowerUsage", h), 1e-3),  # milliwatts
        # KB/s over NVML's 20 ms window.
        pcie_tx_bytes_per_second=_num(call(nv, "nvmlDeviceGetPcieThroughput", h, 0), 1024.0),
        pcie_rx_bytes_per_second=_num(call(nv, "nvmlDeviceGetPcieThroughput", h, 1), 1024.0),
        nvlink_tx_bytes_total=tx,
        nvlink_rx_bytes_total=rx,
    )


def sample_gpus(nv: Any = None) -> list[GpuSample]:
    """Counters of every GPU NVML sees (all of them: a metrics exporter ignores
    CUDA_VISIBLE_DEVICES); an empty list without NVML or GPUs. A GPU NVML cannot open is left
    out; a counter NVML refuses is None."""
    nv = nv if nv is not None else import_pynvml()
    if nv is None:
        return []
    with session(nv) as ok:
        if not ok:
            return []
        handles = {i: call(nv, "nvmlDeviceGetHandleByIndex", i) for i in range(count(nv))}
        return [_sample_one(nv, i, h) for i, h in handles.items() if not isinstance(h, str)]
