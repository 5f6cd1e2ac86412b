"""A case of the thirteenth H200 table (benchmarks/gpu/results/2026-12-04-h200-table13) as its
machine planned it: the model's shape, the kernel table `probe --measure --model` timed there,
and the H200 as NVML read it (the lead's saved reading without the GEMM rates it measured,
which no machine plan had: 05da664) with the case's host record."""

from __future__ import annotations

import json
import tarfile
from dataclasses import replace
from pathlib import Path

from launcher.model.modelspec import ModelSpec, load_model_spec
from launcher.pipeline import hostcosts
from launcher.planner.kernelcost import step_shape
from launcher.probe import kernels
from launcher.probe.topology import Topology, load_topology

REPO = Path(__file__).resolve().parents[2]
T13 = REPO / "benchmarks" / "gpu" / "results" / "2026-12-04-h200-table13"
H200 = REPO / "benchmarks" / "gpu" / "results" / "2026-12-01-h200-lead" / "h200-probe.json"


def table13_case(tmp_path: Path, shape: str, case: str
                 ) -> tuple[ModelSpec, kernels.KernelTable, Topology]:
    """``shape``: the folder under benchmarks/gpu/models; ``case``: the table's case name
    (its host record is host-cost-CASE.json)."""
    with tarfile.open(T13 / "kernels.tgz") as tar:
        raw = [json.load(f) for mem in tar.getmembers() if mem.name.endswith(".json")
               if (f := tar.extractfile(mem)) is not None]
    m = load_model_spec(str(REPO / "benchmarks" / "gpu" / "models" / shape))
    table = next(t for t in map(kernels.table_from_json, raw) if t.shape.name == m.name)
    assert table.key.shape == step_shape(m, 1).key()
    h200 = json.loads(H200.read_text())
    del h200["gpus"][0]["measured"]  # as the machine's plan read it: NVML alone
    (tmp_path / "h200.json").write_text(json.dumps(h200))
    topo = replace(load_topology(str(tmp_path / "h200.json"), {}),
                   host_timing=hostcosts.read(str(T13 / f"host-cost-{case}.json")))
    return m, table, topo
