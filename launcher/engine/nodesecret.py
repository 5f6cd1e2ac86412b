"""The node link's shared secret: what every node of a group must hold before the head lets it in
(nodelink.py proves it with HMAC challenge-response, never sending it).

Where it comes from, first found wins:
    --node-secret-file PATH          a file holding it (a Kubernetes Secret mounted as a file)
    TOPOSERVE_NODE_SECRET            the secret itself (a Kubernetes Secret as an env variable)
    <cache>/node-secret              the default file (TOPOSERVE_CACHE, else ~/.cache/toposerve)
The head writes a new random secret to the file when it has none, mode 600, and says where: the
other nodes need that file's content (on one machine they find the same default file). Every
other node refuses to start without one, in one line that says where to put it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import EngineError

SECRET_ENV = "TOPOSERVE_NODE_SECRET"
DEFAULT_NAME = "node-secret"
MIN_CHARS = 32  # a guessable secret would be no lock: 32 characters of 64 hex digits written
MAX_CHARS = 1024


class NodeSecretError(EngineError):
    """No usable node secret; the message says where to put one."""


@dataclass(frozen=True)
class NodeSecret:
    value: bytes
    where: str  # where it came from, for the console (never the secret itself)
    written: bool = False  # the head made it just now


def parse(text: str, where: str) -> bytes:
    """Pure: the secret held by ``text`` (one line, surrounding spaces dropped), or one line."""
    value = text.strip()
    if not value or "\n" in value or not value.isprintable() or not value.isascii():
        raise NodeSecretError(f"the node secret from {where} is not one line of printable ASCII: "
                              "put one random string in it (`openssl rand -hex 32`)")
    if not MIN_CHARS <= len(value) <= MAX_CHARS:
        raise NodeSecretError(f"the node secret from {where} has {len(value)} characters: use "
                              f"{MIN_CHARS} to {MAX_CHARS} (`openssl rand -hex 32`)")
    return value.encode("ascii")


def resolve(rank: int, path: Path | None, env: Mapping[str, str],
            cache_dir: Path) -> NodeSecret:
    """This node's secret (see the module's docstring); the head writes one when it has none."""
    raw = env.get(SECRET_ENV, "")
    if path is None and raw.strip():
        return NodeSecret(parse(raw, SECRET_ENV), SECRET_ENV)
    file = path if path is not None else cache_dir / DEFAULT_NAME
    if file.exists() or rank != 0:
        return NodeSecret(read(file, rank), str(file))
    return NodeSecret(write_new(file), str(file), written=True)


def read(file: Path, rank: int) -> bytes:
    try:
        mode = file.stat().st_mode
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NodeSecretError(
            f"node {rank} needs the group's node secret and {file} does not exist: copy the file "
            "the head wrote (its console says where) to this path, or pass --node-secret-file "
            f"PATH, or set {SECRET_ENV}") from None
    except OSError as exc:
        raise NodeSecretError(f"cannot read the node secret {file}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise NodeSecretError(f"the node secret {file} is not text") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise NodeSecretError(f"the node secret {file} can be read by other users (mode "
                              f"{stat.S_IMODE(mode):o}): run `chmod 600 {file}`")
    return parse(text, str(file))


def write_new(file: Path) -> bytes:
    """A new random secret in ``file`` (mode 600), created whole or not at all; when another
    launcher created it first, that one's."""
    value = secrets.token_hex(32)
    tmp = file.with_name(f".{file.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(value + "\n")
        try:
            os.link(tmp, file)  # atomic, and never over a secret that is already there
        except FileExistsError:
            return read(file, 0)
    except OSError as exc:
        raise NodeSecretError(f"cannot write a new node secret to {file} ({exc.strerror}): pass "
                              f"--node-secret-file PATH somewhere writable, or set "
                              f"{SECRET_ENV}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return value.encode("ascii")
