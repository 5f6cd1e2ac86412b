"""JSON text read one way by the launcher, the proxy, loadgen and the benchmarks: ``loads`` is
``json.loads`` whose every refusal is a ValueError, so that one ``except ValueError`` at a
caller is whole.

``json.loads`` itself raises RecursionError, not ValueError, on input nested deeper than its
scanner may go (``[`` 100,000 times: a few bytes from any user, server or disk), and that went
past the callers' ``except ValueError`` as a traceback; each caller then grew its own
``except (..., RecursionError)``, easy to forget at the next one. Here it is NestedTooDeep.
Pure: no I/O, no state."""

from __future__ import annotations

import json


class NestedTooDeep(ValueError):
    """JSON nested deeper than Python's parser goes from where it was called.

    A plain ValueError, not a json.JSONDecodeError: a JSONDecodeError carries the position of
    the fault (pos, lineno, colno), callers print it ("... at line 3"), and the C scanner
    reports none for this one; a made-up position would send a user to the wrong place in
    their file."""


def loads(text: str | bytes) -> object:
    """The value of JSON ``text``, exactly as ``json.loads`` reads it; for input the parser
    cannot read, a ValueError of one of three kinds:

    - json.JSONDecodeError: not JSON (its msg, lineno and colno say where);
    - UnicodeDecodeError: bytes in none of the encodings json detects (UTF-8, -16, -32);
    - NestedTooDeep: nested past the parser's depth.

    What json.loads accepts is kept, so that no caller reads anything differently through this
    seam: NaN, Infinity and -Infinity as floats, a number too large for a float as inf,
    integers of up to sys.get_int_max_str_digits() digits (past that a ValueError, Python's own
    guard against quadratic int parsing), the last of duplicate keys. Refusing NaN here would
    make kept records and plans that read today unreadable."""
    try:
        return json.loads(text)
    except RecursionError:
        # Only the scanner recurses in json.loads (no hooks are passed), so this is the input's
        # depth. The depth it reaches is the interpreter's recursion limit less the frames above
        # the caller (3.11), or its C stack limit (3.12 on): no fixed number to name here.
        raise NestedTooDeep("JSON nested deeper than Python's parser reads") from None
