"""The tolerant JSONL loop of benchmarks/gpu's readers (burst_stamps.py's ev-PID.jsonl,
host_speed_read.py's host-speed.jsonl): files written a line at a time by a process that may be
killed mid-line, read row by row, with the lines that are not a row counted and never fatal."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

# the readers run as `python3 benchmarks/gpu/X.py` from a checkout, where toposerve may not be
# installed: the checkout's own topocommon, after an installed one
sys.path.append(str(Path(__file__).resolve().parents[2]))
from topocommon import jsontext

T = TypeVar("T")


def read_rows(lines: Iterable[str], row: Callable[[object], T | None]) -> tuple[list[T], int]:
    """What ``row`` makes of each non-blank line's JSON value (None: that value is no row), and
    the count of the other non-blank lines: not JSON (a line cut by a killed process, garbage,
    nesting past the parser's depth: jsontext's ValueErrors) or no row."""
    rows: list[T] = []
    bad = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            value = jsontext.loads(line)
        except ValueError:
            bad += 1
            continue
        kept = row(value)
        if kept is None:
            bad += 1
        else:
            rows.append(kept)
    return rows, bad
