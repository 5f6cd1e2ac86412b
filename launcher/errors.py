"""Errors of the launcher. Each message tells the user what to do next.

LauncherError
 ├── TopologyError        a topology file or NVML reading that cannot be used
 ├── ModelError           a model that cannot be found or read
 ├── PlanError            no candidate plan fits (carries the numbers)
 ├── EngineError          vLLM missing, wrong version, failed to start
 └── PortInUseError       the port asked for is taken
"""

from __future__ import annotations


class LauncherError(Exception):
    exit_code = 1


class TopologyError(LauncherError):
    pass


class ModelError(LauncherError):
    pass


class PlanError(LauncherError):
    exit_code = 3


class EngineError(LauncherError):
    exit_code = 4


class PortInUseError(LauncherError):
    exit_code = 5


class MeasureError(LauncherError):
    """`probe --measure` cannot measure: no GPU, no torch, or a worker that failed."""

    exit_code = 6
