"""What the planner needs of a Hugging Face hub model (``--model org/name``), fetched with
huggingface_hub into its own cache: config.json, the safetensors index (the checkpoint's real
size), generation_config.json and tokenizer_config.json (sampling defaults, chat template).

The environment is read here, not at huggingface_hub's import: ``HF_ENDPOINT`` (a mirror),
``HF_TOKEN``, ``HF_HOME`` / ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` are passed to each call, so
that what ``env`` says is what happens. Online, the revision is resolved once
(``/api/models/<repo>/revision/<rev>``: the commit and its file list), then only the files the
repository has are fetched (``/<repo>/resolve/<rev>/<file>``), into the cache vLLM reads too.
Offline, or with the hub out of reach, the same files come from the cache. Every way this can
fail ends in one :class:`ModelError` line that says what to do.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import ModelError
from topocommon import jsontext
from topocommon.hub import HubEnv

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
# ModelOpt's quantization, where config.json leaves it out (modelspec.with_side_quant_config)
QUANT_CONFIG = "hf_quant_config.json"
OPTIONAL = (INDEX, "generation_config.json", "tokenizer_config.json", "chat_template.jinja",
            QUANT_CONFIG)

GGUF_ADVICE = ("toposerve plans Hugging Face checkpoints, and vLLM reads GGUF only "
               "experimentally; pass the original model (ORG/NAME or its folder) or its AWQ/GPTQ "
               "4-bit variant")


@dataclass(frozen=True)
class HubModel:
    repo: str
    revision: str
    folder: Path  # the cache snapshot the files are in
    # name -> path: config.json always, the others where the repository has them
    files: Mapping[str, Path]


def fetch(repo: str, revision: str | None, env: Mapping[str, str]) -> HubModel:
    """config.json and the optional files of ``repo`` at ``revision`` (default ``main``)."""
    from huggingface_hub.utils.tqdm import disable_progress_bars

    disable_progress_bars()  # a few kB of JSON: a progress bar per file would be noise
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # our one line says it all
    from huggingface_hub import constants

    hub = HubEnv.from_env(env)
    rev = revision or "main"
    # huggingface_hub reads HF_HUB_OFFLINE once, at its import; what `env` says now decides.
    was_offline = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = hub.offline
    try:
        return _fetch(repo, rev, hub)
    except ModelError:
        raise
    except Exception as exc:  # every failure of the hub client becomes one line
        raise ModelError(_explain(exc, repo, rev, hub)) from exc
    finally:
        constants.HF_HUB_OFFLINE = was_offline


def _fetch(repo: str, rev: str, hub: HubEnv) -> HubModel:
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    present: set[str] | None = None  # which files the repository has, when the hub said
    if not hub.offline:
        try:
            info = HfApi(endpoint=hub.endpoint, token=hub.token).model_info(repo, revision=rev)
            # a mirror may leave the file list out: then every file is asked for
            present = None if info.siblings is None else {s.rfilename for s in info.siblings}
        except _unreachable() as exc:
            # The hub out of reach: what the cache holds may still do (as hf_hub_download does).
            return _from_cache(repo, rev, hub, exc)
    if present is not None and CONFIG not in present:
        if any(name.endswith(".gguf") for name in present):
            raise ModelError(
                f"{repo} holds GGUF files (llama.cpp's format) and no config.json: {GGUF_ADVICE}"
            )
        raise ModelError(
            f"{repo} (revision {rev}) has no config.json: not a transformers model that vLLM "
            "can serve; pass a model repository or a local folder with config.json"
        )

    def download(name: str) -> Path:
        return Path(
            hf_hub_download(
                repo,
                name,
                revision=rev,
                cache_dir=hub.cache,
                endpoint=hub.endpoint,
                token=hub.token,
                local_files_only=hub.offline,
            )
        )

    config = download(CONFIG)
    files = {CONFIG: config}
    for name in OPTIONAL:
        if present is not None and name not in present:
            continue
        try:
            files[name] = download(name)
        except EntryNotFoundError:  # not in this repository (or, offline, not in the cache)
            continue
    return HubModel(repo=repo, revision=rev, folder=config.parent, files=files)


def _from_cache(repo: str, rev: str, hub: HubEnv, cause: BaseException) -> HubModel:
    try:
        return _fetch(repo, rev, HubEnv(hub.endpoint, hub.cache, hub.token, offline=True))
    except Exception as exc:
        if _is_missing_locally(exc):
            raise ModelError(
                f"cannot reach {hub.endpoint} to fetch {repo} ({_first_line(cause)}) and it is "
                f"not in the cache {hub.cache}; check the network or HF_ENDPOINT (a mirror), or "
                "download it once where the hub is reachable"
            ) from exc
        raise


def _unreachable() -> tuple[type[BaseException], ...]:
    import httpx2
    from huggingface_hub.errors import OfflineModeIsEnabled

    return (httpx2.TransportError, OfflineModeIsEnabled)


def _is_missing_locally(exc: BaseException) -> bool:
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    return isinstance(exc, (LocalEntryNotFoundError, OfflineModeIsEnabled))


def _explain(exc: Exception, repo: str, rev: str, hub: HubEnv) -> str:
    """One line for a failure of the hub client: what happened and what to do."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    page = f"{hub.endpoint}/{repo}"
    if isinstance(exc, GatedRepoError):  # before RepositoryNotFoundError: it is a subclass
        token = (
            "HF_TOKEN is set, but its account has no access yet"
            if hub.token
            else f"set HF_TOKEN to a token of that account ({hub.endpoint}/settings/tokens)"
        )
        return f"{repo} is a gated model: accept its licence on {page} (logged in), then {token}"
    if isinstance(exc, RepositoryNotFoundError):
        private = "" if hub.token else "; if it is private, set HF_TOKEN to a token that reads it"
        return (
            f"model {repo!r} not found on {hub.endpoint} and not a local folder: check the name "
            f"(org/name, as on the model's page){private}"
        )
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo} has no revision {rev!r}: pass a branch, tag or commit of {page}"
    if isinstance(exc, RemoteEntryNotFoundError):
        return f"{repo} (revision {rev}) has no config.json: pass a transformers model repository"
    if _is_missing_locally(exc):
        if hub.offline:
            return (
                f"HF_HUB_OFFLINE is set and {repo} (revision {rev}) is not in the cache "
                f"{hub.cache}: unset HF_HUB_OFFLINE to download its config, or fetch it once "
                f"where the hub is reachable (`hf download {repo} config.json`)"
            )
        return f"{repo} (revision {rev}) is not in the cache {hub.cache}: {_first_line(exc)}"
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "an error"
        return f"{hub.endpoint} answered {status} for {repo}: {_first_line(exc)}"
    if isinstance(exc, HFValidationError):
        return f"{repo!r} is not a model id (org/name) nor a local folder: {_first_line(exc)}"
    if isinstance(exc, OSError):
        return f"cannot fetch {repo} into {hub.cache}: {exc.strerror or _first_line(exc)}"
    return f"cannot fetch {repo} from {hub.endpoint}: {type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split("\n\n")[0].split())
    return text[:300] or type(exc).__name__


# ---------------------------------------------------------------------------- what the files say


def checkpoint_bytes(index_path: Path | None) -> int | None:
    """``metadata.total_size`` of a safetensors index: the bytes of every tensor in the
    checkpoint; None without an index or with one that does not say."""
    if index_path is None:
        return None
    try:
        data: Any = jsontext.loads(index_path.read_text())
    except (OSError, ValueError):
        return None
    meta = data.get("metadata") if isinstance(data, dict) else None
    total = meta.get("total_size") if isinstance(meta, dict) else None
    if isinstance(total, bool) or not isinstance(total, (int, float)):
        return None
    return int(total) if 0 < total < 1 << 50 else None


def single_file_bytes(path: Path) -> int | None:
    """The tensor bytes of a one-file checkpoint (``model.safetensors``, which has no index):
    the file less its 8-byte length and its JSON header; None without one, or for a file that
    is not safetensors."""
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
            size = path.stat().st_size
    except OSError:
        return None
    if len(head) < 8:
        return None
    header = int.from_bytes(head, "little")
    # safetensors caps its header at 100 MB; a file shorter than its header is not one
    if not 2 <= header <= 100_000_000 or 8 + header > size:
        return None
    total = size - 8 - header
    return total if total > 0 else None
