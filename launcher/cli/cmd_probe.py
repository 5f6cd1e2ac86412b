"""`launcher probe`: the GPUs and the links between them, read from NVML or a saved file."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from launcher.cli import argtypes
from launcher.cli.probeformat import format_topology
from launcher.errors import MeasureError, TopologyError
from launcher.probe.topology import Topology, load_topology, topology_to_json


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("probe", help="show the GPUs, NVLink/PCIe/P2P links between them")
    p.add_argument("--json", action="store_true", help="print the topology as JSON")
    p.add_argument(
        "--save", metavar="FILE", type=argtypes.nonempty,
        help="write the topology JSON to FILE (for --topology)"
    )
    p.add_argument(
        "--topology", metavar="FILE", type=argtypes.nonempty,
        help="show a saved topology instead of reading NVML"
    )
    p.add_argument(
        "--measure",
        action="store_true",
        help="measure each GPU's bf16 GEMM rates (prefill TFLOP/s, decode GB/s, as vLLM's "
        "F.linear runs them; kept for `launcher plan` on this machine) and peer "
        "copies and a real NCCL all-reduce per pair (needs torch with CUDA), and this host's "
        "front-end costs with the installed vLLM's own functions (kept for `launcher plan`)",
    )
    p.add_argument(
        "--model",
        type=argtypes.model_ref,
        help="with --measure: also time this model's kernels (every operation of a forward "
        "step, on a GPU or, without one, this CPU) and keep the table for `launcher plan`",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.measure and args.topology:
        raise MeasureError(
            "--measure times this machine's GPUs; it cannot measure a saved "
            "topology (run `launcher probe --measure --save FILE` on that machine)"
        )
    if args.model and not args.measure:
        raise MeasureError("--model times a model's kernels: give it with --measure")
    topo = load_topology(args.topology, os.environ)
    if args.measure and topo.gpus:
        from launcher.probe import measure  # torch only when asked

        topo = measure.measure_topology(topo, os.environ)
        from launcher.pipeline import gpuperfs

        for line in gpuperfs.keep(topo, os.environ):  # for later plans on this machine
            print(line)
    if args.measure and not topo.gpus and args.topology is None:
        from launcher.pipeline import enginesteps
        from launcher.probe.enginestep import EngineStepError

        try:  # the CPU engine's own step cost, which the CPU plan adds to its arithmetic
            print(enginesteps.measure(os.environ))
        except EngineStepError as exc:
            raise MeasureError(f"no GPU found, and the CPU engine's step could not be timed: "
                               f"{exc}") from exc
    if args.measure and args.topology is None:
        print(_host_line(topo, os.environ))
    if args.model:
        from launcher.model.modelspec import load_model_spec
        from launcher.pipeline import kerneltables

        for line in kerneltables.measure(load_model_spec(args.model), topo, os.environ):
            print(line)
    data = topology_to_json(topo)
    if args.save:
        try:
            Path(args.save).write_text(json.dumps(data, indent=1) + "\n")
        except OSError as exc:
            raise TopologyError(f"cannot write {args.save}: {exc.strerror}") from exc
    print(json.dumps(data, indent=1) if args.json else format_topology(topo))
    return 0


def _host_line(topo: Topology, env: Mapping[str, str]) -> str:
    """This host's front-end costs timed and kept, or why plans keep the shipped profile."""
    from launcher.pipeline import hostcosts
    from launcher.probe.hostcost import HostCostError

    try:
        return hostcosts.measure(env, gpus=bool(topo.gpus))
    except HostCostError as exc:
        return (f"host front end not timed ({exc}); plans use the shipped server-host "
                f"profile")
