"""The GPU benchmark's model shapes (benchmarks/gpu/models) on one GPU of the H200 pair: what
the cost-model tests read the H200 records' figures against."""

from __future__ import annotations

from launcher.model.modelspec import ModelSpec, load_model_spec
from launcher.planner.costmodel import Layout
from launcher.planner.cudagraphs import Requested
from launcher.planner.layouts import Links, Shape, best_candidate
from launcher.planner.plan import Policy
from launcher.probe.topology import Topology, load_topology
from tests.launcher.paths import H200, REPO

MODELS = REPO / "benchmarks" / "gpu" / "models"


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
