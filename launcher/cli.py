"""`launcher` command line: one sub-command per module, errors turned into exit codes here only.

Each command module exposes ``add_parser(subparsers) -> None`` (which sets ``func`` on its parser
to a ``(argparse.Namespace) -> int`` callable). Domain errors derive from
:class:`launcher.errors.LauncherError` and are printed as one line, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from launcher.errors import LauncherError

# Modules are imported by name so that a command's heavy imports (NVML, torch) cost nothing to
# the others.
COMMANDS = ("probe", "plan", "doctor", "serve", "tune", "model")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launcher",
        description="Plan, check and serve a model on the GPUs (or CPU) of this machine.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"launcher.cmd_{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"launcher.cmd_{name}":
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except LauncherError as exc:
        print(f"launcher: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
