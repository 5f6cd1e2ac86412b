"""The API key file, read one way by the proxy (``--api-key-file``) and the launcher
(``launcher serve --api-key-file``), so that a key the launcher accepts is the key the proxy
checks.

One key per line; surrounding spaces are dropped; a line whose first non-space character is
``#`` is a comment, and so is a blank line. A ``#`` anywhere else belongs to the key: keys are
random strings and may hold one, and cutting a key short at it would make a different key. The
file must not be readable by other users, and must hold at least one key (a file meant to hold
keys that holds none would otherwise run the proxy open to everyone).
"""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path

# The variable the proxy reads its comma-separated keys from, and the launcher hands its keys
# to the proxy in (never argv, which any local user can read)
KEYS_ENV = "TOPOSERVE_API_KEYS"


class KeyFileError(ValueError):
    """The keys given (flags, key file, environment) cannot be used; the message says why and
    what to do."""


def given_keys(flags: Sequence[str], key_file: Path | None, env_value: str, *,
               flag: str, env_name: str) -> tuple[str, ...]:
    """Every key given, read one way by the proxy and by the launcher (which hands its keys on
    to the proxy it starts): the flags, the key file, then the comma-separated variable
    ``env_name`` (whose text is ``env_value``); spaces around a key dropped, repeats once.

    A flag given an empty key (``--api-key "$KEY"`` with KEY unset) and a variable holding only
    commas and spaces are refused: read as 'no key', either would run the proxy open to
    everyone while its user believes it keyed."""
    keys = [k.strip() for k in flags]
    if any(not k for k in keys):
        raise KeyFileError(f"{flag} was given an empty key: pass the key itself, or leave "
                           f"{flag} out to run without keys")
    if key_file is not None:
        keys += read_key_file(key_file)
    env_keys = [k.strip() for k in env_value.split(",") if k.strip()]
    if env_value.strip() and not env_keys:
        raise KeyFileError(f"${env_name} holds no key (only commas or spaces): set it to "
                           "comma-separated keys, or unset it")
    keys += env_keys
    return tuple(dict.fromkeys(keys))


def parse_keys(text: str) -> list[str]:
    """The keys of a key file's text, in order, comments and blank lines left out."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def read_key_file(path: Path) -> list[str]:
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KeyFileError(f"cannot read the API key file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise KeyFileError(f"the API key file {path} is not UTF-8 text") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"the API key file {path} can be read by other users (mode {stat.S_IMODE(mode):o}); "
            f"run `chmod 600 {path}`"
        )
    keys = parse_keys(text)
    if not keys:
        raise KeyFileError(f"the API key file {path} holds no key: put one key per line")
    return keys
