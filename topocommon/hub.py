"""Where the Hugging Face hub is, as the environment says: the endpoint (``HF_ENDPOINT``, a
mirror), the cache (``HF_HUB_CACHE``, ``HF_HOME``, ...), the token and offline mode, read from a
mapping rather than at huggingface_hub's import; and what a repository id looks like. Shared by the
launcher's model reader and loadgen's tokenizer loader, so both find the same files. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"

# huggingface_hub's repo id rule: one '/' between two names of letters, digits, '-', '_', '.'.
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TRUE = ("1", "ON", "YES", "TRUE")


@dataclass(frozen=True)
class HubEnv:
    endpoint: str
    cache: Path
    token: str | None
    offline: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HubEnv:
        return cls(
            endpoint=(env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
            cache=hub_cache_dirs(env)[0],
            token=env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None,
            offline=any(
                env.get(k, "").upper() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
            ),
        )


def hub_cache_dirs(env: Mapping[str, str]) -> list[Path]:
    """Where huggingface_hub keeps downloads, in its own order of precedence."""
    out = []
    if env.get("HF_HUB_CACHE"):
        out.append(Path(env["HF_HUB_CACHE"]))
    if env.get("HUGGINGFACE_HUB_CACHE"):
        out.append(Path(env["HUGGINGFACE_HUB_CACHE"]))
    home = Path(
        env.get("HF_HOME")
        or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    )
    out.append(home / "hub")
    return out


def is_repo_id(ref: str) -> bool:
    return bool(_REPO_ID.match(ref)) and ".." not in ref
