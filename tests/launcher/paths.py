"""Where the fixtures live: all under tests/fixtures, so a plain clone runs every test."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "tests" / "fixtures" / "topologies"
H200 = TOPOLOGIES / "h200x2-nvlink.nvml.json"
MODELS = REPO / "tests" / "fixtures" / "models"


def topo(name: str) -> str:
    return str(TOPOLOGIES / f"{name}.nvml.json")


def model(name: str) -> str:
    return str(MODELS / name)
