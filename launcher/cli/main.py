"""`launcher` command line: one sub-command per module, errors turned into exit codes here only.

Each command module exposes ``add_parser(subparsers) -> None`` (which sets ``func`` on its parser
to a ``(argparse.Namespace) -> int`` callable). Domain errors derive from
:class:`launcher.errors.LauncherError` and are printed as one line, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
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
            module = importlib.import_module(f"launcher.cli.cmd_{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"launcher.cli.cmd_{name}":
                raise
            continue
        module.add_parser(sub)
    return parser


# What a command killed by SIGPIPE exits with (128 + 13), as `launcher plan | head` expects.
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # a reader gone before the last buffered line shows here, not at exit
    except LauncherError as exc:
        print(f"launcher: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    return code


def _drop_stdout() -> None:
    """The reader of stdout is gone (``| head``): point stdout at /dev/null, so that the flush
    at interpreter exit does not fail again and print a traceback (Python's documented recipe)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return  # stdout is no file descriptor (a test's buffer): nothing will flush it at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    except OSError:
        pass
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
