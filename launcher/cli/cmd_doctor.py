"""`launcher doctor`: PASS/WARN/FAIL checks of this machine, each with its fix."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from typing import Any

from launcher.cli import argtypes
from launcher.doctor.checks import FAIL, format_checks, read_host_facts, run_checks
from launcher.probe.topology import load_topology


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "doctor", help="check GPUs, links, drivers and limits; say how to fix"
    )
    p.add_argument("--topology", metavar="FILE", type=argtypes.nonempty,
                   help="check a saved topology instead of NVML")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    topo = load_topology(args.topology, os.environ)
    # A saved topology comes from another machine: this host's limits say nothing about it.
    checks = run_checks(topo, os.environ, None if args.topology else read_host_facts())
    print(json.dumps([asdict(c) for c in checks], indent=1) if args.json else format_checks(checks))
    return 1 if any(c.status == FAIL for c in checks) else 0
