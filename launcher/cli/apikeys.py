"""The proxy's API keys as serve and tune collect them: --api-key, the key file and
TOPOSERVE_API_KEYS, read exactly as the proxy reads them (topocommon.keyfile.given_keys)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from launcher.errors import LauncherError
from topocommon import keyfile

KEYS_ENV = keyfile.KEYS_ENV


def collect_api_keys(flags: Sequence[str], path: Path | None,
                     env: Mapping[str, str]) -> tuple[str, ...]:
    try:
        keys = keyfile.given_keys(flags, path, env.get(KEYS_ENV, ""), flag="--api-key",
                                  env_name=KEYS_ENV)
    except keyfile.KeyFileError as exc:
        raise LauncherError(str(exc)) from None
    for key in keys:
        # the launcher hands its keys to the proxy in $TOPOSERVE_API_KEYS, comma-separated: a
        # comma would split the key into two others, each of which the proxy would take
        if "," in key:
            raise LauncherError("an API key holding a comma cannot be handed to the proxy "
                                f"(${KEYS_ENV} separates keys with commas): pick a key "
                                "without one")
        if "\x00" in key:  # no process environment can hold it
            raise LauncherError("an API key cannot hold a NUL character: pick another key")
    return keys
