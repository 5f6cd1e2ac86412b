"""A stand-in for the ``pynvml`` module, for the one place no real thing can run here: NVML
without a GPU. It answers from a plain description of GPUs and refuses the calls GeForce cards
refuse, with exception classes named as pynvml names them."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


@dataclass
class FakeGpu:
    name: str
    uuid: str
    bus: str
    memory: int
    cc: tuple[int, int] = (8, 6)
    width: tuple[int, int] = (16, 16)  # (current, max)
    gen: tuple[int, int] = (1, 4)
    nvlink_remote: list[str] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)  # pynvml function names that raise NotSupported
    used: int = 300 << 20  # what an idle card reports in use (the driver's own reservation)
    mig: tuple[int, int] | None = None  # (current, pending) MIG mode; None: no MIG (GeForce)


class FakeNvml:
    """Module-like: attribute access gives pynvml-named functions."""

    NVMLError = NVMLError

    def __init__(
        self,
        gpus: list[FakeGpu],
        p2p: dict[tuple[int, int, int], int],
        ancestor: int = 30,
        driver_loaded: bool = True,
    ) -> None:
        self.gpus, self.p2p, self.ancestor, self.driver_loaded = gpus, p2p, ancestor, driver_loaded
        self.calls: list[str] = []
        self.initialised = False

    def _gpu(self, h: int, fn: str) -> FakeGpu:
        self.calls.append(fn)
        g = self.gpus[h]
        if fn in g.refuse:
            raise NVMLError_NotSupported()
        return g

    def nvmlInit(self) -> None:
        if not self.driver_loaded:
            raise NVMLError_DriverNotLoaded()
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.120"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        assert self.initialised
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self._gpu(h, "nvmlDeviceGetName").name.encode()  # old pynvml returns bytes

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self._gpu(h, "nvmlDeviceGetPciInfo").bus.encode())

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=g.memory, used=g.used, free=g.memory - g.used)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return self._gpu(h, "nvmlDeviceGetCudaComputeCapability").cc

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkGeneration").gen[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkGeneration").gen[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkWidth").width[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkWidth").width[1]

    def nvmlDeviceGetNumaNodeId(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetNumaNodeId")
        return 0

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        g = self._gpu(h, "nvmlDeviceGetMigMode")
        if g.mig is None:
            raise NVMLError_NotSupported()
        return g.mig

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetPersistenceMode")
        return 0

    def nvmlDeviceGetCpuAffinity(self, h: int, size: int) -> list[int]:
        self._gpu(h, "nvmlDeviceGetCpuAffinity")
        return [0xFF] + [0] * (size - 1)

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetNvLinkState")
        if link >= len(g.nvlink_remote):
            raise NVMLError_InvalidArgument()
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return SimpleNamespace(
            busId=self._gpu(h, "nvmlDeviceGetNvLinkRemotePciInfo").nvlink_remote[link]
        )

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        self._gpu(a, "nvmlDeviceGetTopologyCommonAncestor")
        return self.ancestor

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: Any) -> int:
        # pynvml's NVML_P2P_CAPS_INDEX_READ is the tuple (0,): the C call needs the integer.
        if not isinstance(index, int):
            raise TypeError(f"p2p index must be an int, got {index!r}")
        self._gpu(a, "nvmlDeviceGetP2PStatus")
        return self.p2p.get((a, b, index), 5)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=42, memory=10)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetPowerUsage")
        return 250_500  # milliwatts

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        self._gpu(h, "nvmlDeviceGetPcieThroughput")
        return 1000 if counter == 0 else 2000  # KB/s

    def nvmlDeviceGetFieldValues(self, h: int, fields: list[Any]) -> list[Any]:
        self._gpu(h, "nvmlDeviceGetFieldValues")
        return [
            SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=10 * (i + 1)))
            for i, _ in enumerate(fields)
        ]
