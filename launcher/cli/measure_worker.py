"""The workers of `launcher probe --measure`, each run as ``python -m launcher.cli.measure_worker
WHAT`` by :mod:`launcher.probe.measure` in a process of its own (one per GPU or pair, so that a
CUDA context or NCCL group never outlives its measurement)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher.probe import kernelprobe, measure


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m launcher.cli.measure_worker", description="probe --measure workers"
    )
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("copy")
    c.add_argument("--out", type=Path, required=True)
    g = sub.add_parser("gemm")
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    g.add_argument("--tiny", action="store_true", help="tiny shapes (tests on a CPU)")
    a = sub.add_parser("allreduce")
    a.add_argument("--rank", type=int, required=True)
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--out", type=Path, required=True)
    k = sub.add_parser("kernels")
    k.add_argument("--shape", type=Path, required=True)
    k.add_argument("--key", required=True)
    k.add_argument("--out", type=Path, required=True)
    args: Any = p.parse_args(argv)
    if args.what == "copy":
        measure.copy_worker(args.out)
    elif args.what == "gemm":
        measure.gemm_worker(args.out, args.device, args.tiny)
    elif args.what == "kernels":
        kernelprobe.gpu_table_worker(args.shape, args.key, args.out)
    else:
        measure.allreduce_worker(args.rank, args.port, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
