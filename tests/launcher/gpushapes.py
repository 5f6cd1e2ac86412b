"""The GPU benchmark's model shapes (benchmarks/gpu/models) on one GPU of the H200 pair: what
the cost-model tests read the H200 records' figures against."""

from __future__ import annotations

import json
import tarfile
from functools import cache
from typing import Any

from launcher.model.modelspec import ModelSpec, load_model_spec
from launcher.planner.costmodel import Layout
from launcher.planner.cudagraphs import Requested
from launcher.planner.layouts import Links, Shape, best_candidate
from launcher.planner.plan import Policy
from launcher.probe.topology import Topology, load_topology
from tests.launcher.paths import H200, REPO

MODELS = REPO / "benchmarks" / "gpu" / "models"
# the third H200 table's kernel tables: vLLM 0.26's ops at each shape's exact sizes, replayed
# from CUDA graphs
TABLE3_KERNELS = REPO / "benchmarks" / "gpu" / "results" / "2026-12-02-h200-table3" / "kernels.tgz"


@cache
def h200_kernel_times(shape: str) -> tuple[dict[str, Any], ...]:
    """The ``times`` rows of the H200 kernel table of ``shape`` (a benchmarks/gpu/models name)
    in TABLE3_KERNELS; LookupError where it holds none."""
    with tarfile.open(TABLE3_KERNELS) as tar:
        for member in tar.getmembers():
            f = tar.extractfile(member)
            if f is None:
                continue
            table = json.load(f)
            if table["shape"]["name"] == shape:
                return tuple(table["times"])
    raise LookupError(shape)


def spec(name: str) -> ModelSpec:
    return load_model_spec(str(MODELS / name))


def topology() -> Topology:
    return load_topology(str(H200), {})


# the records' engines captured CUDA graphs up to 64 tokens (their --compilation-config,
# benchmarks/gpu/run_config.sh), so a 512-token prompt ran eagerly
RECORDS_GRAPHS = Requested(64)


def one_gpu(m: ModelSpec, graphs: Requested = RECORDS_GRAPHS) -> Layout:
    _, lay = best_candidate(m, Policy(force_tp=1, force_pp=1, force_dp=1),
                            Links(topology(), graphs), topology().gpus, Shape(1, 1, 1))
    assert lay is not None
    return lay
