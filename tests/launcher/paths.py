"""Where the fixtures live: ours under tests/fixtures, the real machine dumps in ../shared."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_TOPOLOGIES = REPO / ".." / "shared" / "fixtures" / "topologies"
H200 = SHARED_TOPOLOGIES / "h200x2-nvlink.nvml.json"
TOPOLOGIES = REPO / "tests" / "fixtures" / "topologies"
MODELS = REPO / "tests" / "fixtures" / "models"


def topo(name: str) -> str:
    return str(H200 if name == "h200x2-nvlink" else TOPOLOGIES / f"{name}.nvml.json")


def model(name: str) -> str:
    return str(MODELS / name)
