"""Which engine flags the installed vLLM takes, and the optional ones it lacks left out with a note.

The launcher adds flags that only newer vLLM releases know (``--allowed-media-domains``,
``--kv-offloading-backend``, ``--performance-mode``...). vLLM refuses an unknown flag at start-up,
so each such flag is checked first. Asking vLLM's own parser means importing vLLM (tens of
seconds on a cold disk), so the flags are read from the source of the installed vLLM's
``EngineArgs.add_cli_args`` (``vllm/engine/arg_utils.py``), where every engine flag is written as a
string literal (vLLM 0.10 through 0.32). Only engine flags are checked this way; the frontend's
(``--api-key``, ``--tool-call-parser``) are generated from a dataclass and are not listed there.
"""

from __future__ import annotations

import importlib.metadata as md
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from launcher.engine.detect import DISTRIBUTIONS

ARG_SOURCE = "vllm/engine/arg_utils.py"
_FLAG = re.compile(r"""["'](--[a-z0-9][a-z0-9-]*)["']""")


def flags_in_source(text: str) -> frozenset[str]:
    """The ``"--flag"`` string literals of a Python source text. Pure."""
    return frozenset(_FLAG.findall(text))


def _arg_source(dist: str) -> Path | None:
    try:
        path = Path(str(md.distribution(dist).locate_file(ARG_SOURCE)))
    except md.PackageNotFoundError:
        return None
    return path if path.is_file() else None


@lru_cache(maxsize=1)
def installed_engine_flags() -> frozenset[str] | None:
    """The installed vLLM's engine flags; None when no vLLM (or its source) can be read."""
    for dist in DISTRIBUTIONS:
        path = _arg_source(dist)
        if path is None:
            continue
        try:
            return flags_in_source(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            return None
    return None


@dataclass(frozen=True)
class OptionalFlag:
    """Flags the launcher would like to give (``words``: the flag, then its values), and why."""

    words: tuple[str, ...]
    why: str

    @property
    def flag(self) -> str:
        return self.words[0]


def keep_known(wanted: Sequence[OptionalFlag], known: frozenset[str] | None
               ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the words of every wanted flag the engine knows, a note for each it lacks). With
    ``known`` None (no vLLM found to ask) every flag is left out: a flag vLLM refuses would stop
    the start, a flag left out only loses what it was for. Pure."""
    words: list[str] = []
    notes: list[str] = []
    for opt in wanted:
        if known is not None and opt.flag in known:
            words += opt.words
        elif known is not None:
            notes.append(f"{opt.flag} left out: the installed vLLM does not take it ({opt.why})")
        else:
            notes.append(f"{opt.flag} left out: no installed vLLM could be read to check that it "
                         f"takes it ({opt.why})")
    return tuple(words), tuple(notes)


def last_value(args: Sequence[str], flag: str) -> str | None:
    """The value of the last ``flag V`` or ``flag=V`` in ``args`` (vLLM takes the last)."""
    found = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith(flag + "="):
            found = a[len(flag) + 1:]
    return found
