"""A ``pynvml`` for a proxy process in the tests: the fake NVML of tests/launcher (one H200)
whose PCIe throughput reads block until the file named by $TOPOSERVE_TEST_NVML_GATE exists —
an NVML slow without bound, to show that a scrape never waits for it. Put this directory first
on PYTHONPATH to use it."""

from __future__ import annotations

import os
import time
from typing import Any

from tests.launcher.fake_pynvml import FakeGpu, FakeNvml

_GATE = os.environ.get("TOPOSERVE_TEST_NVML_GATE", "")


class _GatedNvml(FakeNvml):
    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        while _GATE and not os.path.exists(_GATE):
            time.sleep(0.01)
        return super().nvmlDeviceGetPcieThroughput(h, counter)


_NV = _GatedNvml([FakeGpu("NVIDIA H200", "GPU-0", "00000000:01:00.0", 141 * 2**30)], {})
NVMLError = _NV.NVMLError


def __getattr__(name: str) -> Any:
    return getattr(_NV, name)
