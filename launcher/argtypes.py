"""argparse value types shared by the subcommands: a value out of range is refused by argparse
itself, in one line that names the option, before anything is planned or started."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T", int, float)


def _parsed(text: str, convert: Callable[[str], T], what: str) -> T:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, not {text!r}") from None


def _refuse(why: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(why)


def count(text: str) -> int:
    """A whole number of at least 1 (GPUs, streams, tokens, nodes)."""
    value = _parsed(text, int, "a whole number")
    if value < 1:
        raise _refuse(f"must be at least 1, not {value}")
    return value


def whole(text: str) -> int:
    """A whole number of at least 0 (attempts, warm-up requests)."""
    value = _parsed(text, int, "a whole number")
    if value < 0:
        raise _refuse(f"cannot be negative, not {value}")
    return value


def port(text: str) -> int:
    """A TCP port, 0-65535 (0: any free port)."""
    value = _parsed(text, int, "a port number")
    if not 0 <= value <= 65535:
        raise _refuse(f"a port lies between 0 and 65535, not {value}")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds, 0 or more."""
    value = _parsed(text, float, "a number of seconds")
    if not math.isfinite(value) or value < 0:
        raise _refuse(f"must be a finite number of seconds, not {text}")
    return value


def positive(text: str) -> float:
    """A finite number above 0 (seconds, Gbit/s)."""
    value = _parsed(text, float, "a number")
    if not math.isfinite(value) or value <= 0:
        raise _refuse(f"must be a finite number above 0, not {text}")
    return value


def name(text: str) -> str:
    """A name clients will send (no blank, no whitespace inside)."""
    if not text.strip() or any(c.isspace() for c in text):
        raise _refuse(f"must be a name without spaces, not {text!r}")
    return text


def nonempty(text: str) -> str:
    """A path or id that says something (a folder may have spaces in its name)."""
    if not text.strip():
        raise _refuse("must not be empty")
    return text


def host_port(text: str) -> str:
    """HOST:PORT of a service (a Ray head; also Ray's own ``auto`` and ``ray://HOST:PORT``)."""
    if text == "auto":
        return text
    host, sep, number = text.removeprefix("ray://").rpartition(":")
    if not sep or not host.strip("[]") or not number.isdigit() or not 1 <= int(number) <= 65535:
        raise _refuse(f"expected HOST:PORT (e.g. 10.0.0.1:6379), not {text!r}")
    return text
