"""Golden plans: what `launcher plan --json` prints for every fixture topology x every fixture
model x both workloads x a few request shapes, kept under tests/fixtures/golden/ so that a change
of the launcher's insides that changes a plan shows as a diff (test_golden_plans.py).

Each case runs the real command line (``launcher.cli.main.main``) in this process, with the few
inputs that belong to the machine pinned: the CPU count and affinity (what the CPU engine is
planned and pinned with) and the environment (nothing but PATH, HOME and an offline hub). Paths
under the repository are written as ``<repo>`` so that a clone anywhere reads the same files.

Record (after a deliberate change of plans, say which in the commit):
    .venv/bin/python -m tests.launcher.golden
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from tests.launcher.paths import MODELS, REPO, TOPOLOGIES

GOLDEN = REPO / "tests" / "fixtures" / "golden"
WORKLOADS = ("interactive", "throughput")
# (prompt, gen, concurrency): the defaults, a long prompt with a short answer, a short prompt
# with a long answer at a fixed concurrency.
SHAPES: tuple[tuple[int, int, int | None], ...] = ((512, 256, None), (4000, 50, None),
                                                   (128, 1024, 8))
PINNED_CPUS = 16
# Recent families whose real config.json sits in tests/fixtures/recent-models (README there) and
# that no folder of tests/fixtures/models has: Llama 4 (chunked local attention, MoE, the
# multimodal wrapper's text config), Qwen3.5 (gated delta-net linear attention beside full
# attention) and Nemotron-H (Mamba2 layers beside attention). Their plans are kept too.
RECENT_MODELS = ("llama-4-scout-17b-16e-instruct", "qwen3.5-27b", "nemotron-h-56b-base-8k")


def topologies() -> list[Path]:
    """Every fixture topology a plan can be made for (`topo -m` text names no GPU memory), and
    a machine without GPUs, for the CPU engine's path."""
    found = sorted(p for p in TOPOLOGIES.iterdir() if p.suffix == ".json")
    return [*found, GOLDEN / "cpu-only.toposerve.json"]


def models() -> list[Path]:
    """Every fixture model's folder, then :data:`RECENT_MODELS`' (their names are unique)."""
    recent = REPO / "tests" / "fixtures" / "recent-models"
    return [*sorted(p for p in MODELS.iterdir() if (p / "config.json").is_file()),
            *(recent / name for name in RECENT_MODELS)]


def case_key(workload: str, shape: tuple[int, int, int | None]) -> str:
    prompt, gen, conc = shape
    return f"{workload} prompt={prompt} gen={gen} concurrency={conc or '-'}"


def argv(topology: Path, model: Path, workload: str,
         shape: tuple[int, int, int | None]) -> list[str]:
    prompt, gen, conc = shape
    args = ["plan", "--json", "--topology", str(topology), "--model", str(model),
            "--workload", workload, "--prompt", str(prompt), "--gen", str(gen)]
    return args + (["--concurrency", str(conc)] if conc else [])


@contextlib.contextmanager
def pinned_machine() -> Iterator[None]:
    # The GPU engine's vLLM: the release the golden GPU plans assume (the lent H200 and H100's
    # 0.26, whose CUDA-graph rule memfit's figures were checked on), not the build installed here
    # (engine/detect.served_vllm; a CPU build would leave the GPU engine's unknown).
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TOPOSERVE_VLLM_VERSION": "0.26.0"}
    for key in ("HOME", "XDG_CACHE_HOME", "HF_HOME"):  # where the model-shape cache lives
        if key in os.environ:
            env[key] = os.environ[key]
    # A kernel table kept by `probe --measure --model` on this machine would change the speeds:
    # golden plans are made from the shipped tables only.
    # (removed afterwards: one a case, ~1,600 a suite run, were left in /tmp before)
    with tempfile.TemporaryDirectory(prefix="golden-cache-") as cache:
        env["TOPOSERVE_CACHE"] = cache
        with mock.patch.dict(os.environ, env, clear=True), \
                mock.patch("os.cpu_count", return_value=PINNED_CPUS), \
                mock.patch("os.sched_getaffinity", return_value=set(range(PINNED_CPUS)),
                           create=True):
            yield


def run_case(topology: Path, model: Path, workload: str,
             shape: tuple[int, int, int | None]) -> dict[str, Any]:
    from launcher.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with pinned_machine(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv(topology, model, workload, shape))
        except SystemExit as exc:  # argparse's own refusals
            code = exc.code if isinstance(exc.code, int) else 2
    text = out.getvalue().replace(str(REPO), "<repo>")
    return {
        "exit": code,
        "plan": json.loads(text) if code == 0 else text,
        "stderr": err.getvalue().replace(str(REPO), "<repo>"),
    }


def record_for(topology: Path, model: Path) -> dict[str, Any]:
    return {case_key(w, s): run_case(topology, model, w, s) for w in WORKLOADS for s in SHAPES}


def golden_file(topology: Path, model: Path) -> Path:
    return GOLDEN / topology.name.split(".")[0] / f"{model.name}.json"


def dump(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


def main() -> int:
    for topology in topologies():
        for model in models():
            path = golden_file(topology, model)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(dump(record_for(topology, model)))
        print(f"recorded {topology.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
