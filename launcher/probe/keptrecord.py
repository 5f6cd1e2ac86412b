"""Reading back a record `probe --measure` kept in the cache, with a reason when it cannot be used.

`probe --measure` keeps four kinds of measured record under the cache (``TOPOSERVE_CACHE``, else
``~/.cache/toposerve``), each at its key's path and written whole by
:func:`launcher.probe.kernels.write_cache_json`: each GPU's GEMM rates (``gpu-perf/``), the host's
front-end timing (``host-cost/``), a model's kernel tables (``kernels/``) and the CPU engine's
step (``engine-step/``). A plan made on the machine reads them back through :func:`read`: the
record, or, where a file is there and cannot be used (unreadable, too large, not JSON, another
format, a field out of range, another key's), one line that names the file, what is wrong with
it, what the plan uses instead and how to measure again. No file is no reason: nothing was
measured for that key, and the plan's other lines say what it assumed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from topocommon import jsontext

R = TypeVar("R")
K = TypeVar("K")

# The largest kept file read: a kernel table with every timing is tens of kB, the others a few
MAX_BYTES = 16 << 20
# A reason's own words (the parser's) are cut to this: the line stays one line of a plan
MAX_PROBLEM = 240
AGAIN = "`launcher probe --measure` measures it again"


@dataclass(frozen=True)
class Kind(Generic[R, K]):
    """One kind of kept record: how a plan names it and what a plan does without it.

    ``parse`` turns the file's JSON into the record, raising ValueError (one line) for anything
    it cannot use; ``key_of`` is the key the record says it was measured for."""

    what: str  # "the host timing `probe --measure` kept"
    fallback: str  # what the plan does instead: "planned from the datasheet table"
    parse: Callable[[Any], R]
    key_of: Callable[[R], K]
    again: str = AGAIN
    max_bytes: int = MAX_BYTES

    def line(self, path: Path, problem: str) -> str:
        """The reason line for the file at ``path`` that cannot be used because ``problem``."""
        said = " ".join(problem.split())
        if len(said) > MAX_PROBLEM:
            said = said[:MAX_PROBLEM - 3] + "..."
        return f"{self.what} ({path}) {said}: {self.fallback}; {self.again}"


def number_field(raw: Any, what: str, hi: float, error: type[ValueError]) -> float:
    """A saved record's positive finite number below ``hi``; ``error`` (one line) otherwise.
    Each kind's parser reads its fields with it."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise error(f"{what} is not a number: {str(raw)[:40]!r}")
    value = float(raw)
    if not math.isfinite(value) or not 0 < value < hi:
        raise error(f"{what} is out of range: {value!r}")
    return value


def text_field(raw: Any, what: str, error: type[ValueError]) -> str:
    """A saved record's text field, at most 200 characters; ``error`` when it is not text."""
    if not isinstance(raw, str):
        raise error(f"{what} is not text")
    return raw[:200]


def write_cache_json(path: Path, data: object) -> Path | None:
    """Write ``data`` to ``path`` whole or not at all (a reader never sees half a file); None
    when the cache cannot be written. Every kind of kept record is written this way."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:
        return None
    return path


def read(kind: Kind[R, K], path: Path, key: K) -> tuple[R | None, str]:
    """The record kept at ``path`` for ``key`` and ``""``; or None and ``""`` where no file is
    there; or None and :meth:`Kind.line`'s one line where one is there and cannot be used.
    Never raises: a file a user's disk or editor mangled is a reason, not a traceback."""
    try:
        with path.open("rb") as f:
            data = f.read(kind.max_bytes + 1)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, kind.line(path, f"cannot be read ({exc.strerror or type(exc).__name__})")
    if len(data) > kind.max_bytes:
        return None, kind.line(path, f"is larger than {kind.max_bytes >> 10} kB, no kept record")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # write_cache_json writes ASCII: bytes a disk or editor mangled
        return None, kind.line(path, "is not JSON (not UTF-8 text)")
    try:
        raw = jsontext.loads(text)
    except ValueError:
        return None, kind.line(path, "is not JSON")
    try:
        rec = kind.parse(raw)
        got = kind.key_of(rec)
    except ValueError as exc:  # the record's own one-line reason: its format, a field
        return None, kind.line(path, f"cannot be used ({exc})")
    # RecursionError here is the kind's own: a parse that walks or prints (str, repr) a field
    # nested as deep as jsontext reads; jsontext's refusals are all ValueErrors, caught above
    except (TypeError, LookupError, AttributeError, ArithmeticError, RecursionError) as exc:
        return None, kind.line(path, f"cannot be used (a field is malformed: "
                               f"{type(exc).__name__})")
    if got != key:
        return None, kind.line(path, f"was measured for another key ({_differs(got, key)})")
    return rec, ""


def _differs(got: object, want: object) -> str:
    """Which of the key's fields differ: "its vllm differs"."""
    if dataclasses.is_dataclass(got) and dataclasses.is_dataclass(want):
        names = [f.name for f in dataclasses.fields(got)
                 if getattr(got, f.name, None) != getattr(want, f.name, None)]
        if names:
            return f"its {', '.join(names)} {'differs' if len(names) == 1 else 'differ'}"
    return "its key differs"
