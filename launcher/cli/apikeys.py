"""The proxy's API keys as serve and tune collect them: --api-key, TOPOSERVE_API_KEYS and the
key file (read exactly as the proxy reads it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from launcher.errors import LauncherError


def collect_api_keys(flags: Sequence[str], path: Path | None,
                     env: Mapping[str, str]) -> tuple[str, ...]:
    keys = [k for k in flags if k]
    keys += [k.strip() for k in env.get("TOPOSERVE_API_KEYS", "").split(",") if k.strip()]
    if path is not None:
        keys += read_key_file(path)
    return tuple(dict.fromkeys(keys))


def read_key_file(path: Path) -> list[str]:
    """The file's keys, read exactly as the proxy reads them (topocommon.keyfile)."""
    from topocommon import keyfile

    try:
        return keyfile.read_key_file(path)
    except keyfile.KeyFileError as exc:
        raise LauncherError(str(exc)) from None
