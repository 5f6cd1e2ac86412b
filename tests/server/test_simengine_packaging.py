"""The simulated engine is its own package: the proxy neither imports nor ships it."""

from __future__ import annotations

import ast
from pathlib import Path

import httpx
import pytest

from simengine.engine import SimConfig, spawn

REPO = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", ["server", "launcher", "loadgen"])
def test_product_packages_never_import_the_simulated_engine(package: str) -> None:
    for path in sorted((REPO / package).rglob("*.py")):
        sim = {m for m in imported_modules(path) if m.split(".")[0] == "simengine"}
        assert not sim, f"{path.relative_to(REPO)} imports {sorted(sim)}"


def test_no_simulator_module_is_left_in_the_proxy_package() -> None:
    assert not sorted(p.name for p in (REPO / "server").glob("sim*.py"))


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "proxy.Dockerfile"])
def test_images_do_not_ship_the_simulated_engine(dockerfile: str) -> None:
    docker = REPO / "deploy" / "docker"
    copies = [line for line in (docker / dockerfile).read_text().splitlines()
              if line.startswith(("COPY ", "ADD "))]
    assert copies
    # Neither the package by name nor the whole context (". ") is copied.
    assert not [line for line in copies if "simengine" in line or " . " in line]
    allowed = [line for line in (docker / f"{dockerfile}.dockerignore").read_text().splitlines()
               if line.startswith("!")]
    assert "*" in (docker / f"{dockerfile}.dockerignore").read_text().splitlines()
    assert not [line for line in allowed if "simengine" in line]


def test_spawn_runs_the_engine_from_any_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with spawn(SimConfig()) as url:
        assert httpx.get(url + "/version").json() == {"version": "simengine"}
