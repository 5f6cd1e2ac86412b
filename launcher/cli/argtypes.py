"""argparse value types shared by the subcommands: a value out of range is refused by argparse
itself, in one line that names the option, before anything is planned or started."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from topocommon.hub import is_repo_id

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


def path(text: str) -> Path:
    """A file or folder named on the command line: never empty (``--log-dir "$DIR"`` with DIR
    unset would otherwise be '.', the folder the user happens to be in)."""
    return Path(nonempty(text))


def fraction(text: str) -> float:
    """A share above 0 and at most 1 (of a GPU's memory)."""
    value = _parsed(text, float, "a number")
    if not 0 < value <= 1:  # also refuses nan
        raise _refuse(f"must be above 0 and at most 1, not {text}")
    return value


_HUB_HOSTS = ("huggingface.co", "www.huggingface.co", "hf.co")


def model_ref(text: str) -> str:
    """A local folder or config.json, a hub id, or a hub model page's URL (read as its id: what
    a user copies from the browser). A hub id typed with a trailing '/' is the id."""
    nonempty(text)
    if "://" not in text:
        stripped = text.rstrip("/")
        if stripped != text and not Path(text).expanduser().exists() and is_repo_id(stripped):
            return stripped
        return text
    parts = urlsplit(text)
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT", "")).hostname
    segs = [s for s in parts.path.split("/") if s]
    if parts.scheme in ("http", "https") and parts.hostname in (*_HUB_HOSTS, endpoint) and \
            len(segs) >= 2 and is_repo_id("/".join(segs[:2])) and \
            segs[0] not in ("datasets", "spaces"):
        repo = "/".join(segs[:2])
        if len(segs) >= 4 and segs[2] in ("tree", "blob", "resolve") and segs[3] != "main":
            raise _refuse(f"a page of revision {segs[3]!r}: pass --model {repo} "
                          f"--revision {segs[3]}")
        return repo
    raise _refuse(f"{text!r} is not a model: pass a local folder, a hub id (ORG/NAME), or a "
                  "hub model page (https://huggingface.co/ORG/NAME)")


def host_port(text: str) -> str:
    """HOST:PORT of a service (a Ray head; also Ray's own ``auto`` and ``ray://HOST:PORT``)."""
    if text == "auto":
        return text
    host, sep, number = text.removeprefix("ray://").rpartition(":")
    if not sep or not host.strip("[]") or not number.isdigit() or not 1 <= int(number) <= 65535:
        raise _refuse(f"expected HOST:PORT (e.g. 10.0.0.1:6379), not {text!r}")
    return text
