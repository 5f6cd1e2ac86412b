"""The proxy's modules import one another without a cycle, ``server/__init__.py`` included (it
imports nothing): a module can be loaded, and read, on its own."""

from __future__ import annotations

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "server"


def imports_of(path: Path) -> set[str]:
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "server":
            deps |= {"server"} | {f"server.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("server."):
            deps.add(node.module or "")
        elif isinstance(node, ast.Import):
            deps |= {a.name for a in node.names if a.name.split(".")[0] == "server"}
    return deps


def graph() -> dict[str, set[str]]:
    return {("server" if p.stem == "__init__" else f"server.{p.stem}"): imports_of(p)
            for p in SERVER.glob("*.py")}


def cycle_from(g: dict[str, set[str]], start: str) -> list[str] | None:
    stack = [(start, [start])]
    while stack:
        node, path = stack.pop()
        for dep in g.get(node, set()):
            if dep == start:
                return [*path, dep]
            if dep not in path:
                stack.append((dep, [*path, dep]))
    return None


def test_the_proxy_package_has_no_import_cycle() -> None:
    g = graph()
    assert g["server"] == set()
    assert [c for c in (cycle_from(g, m) for m in g) if c] == []


def test_the_cycle_finder_finds_one() -> None:
    assert cycle_from({"a": {"b"}, "b": {"c"}, "c": {"a"}}, "a") == ["a", "b", "c", "a"]
