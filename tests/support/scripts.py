"""A benchmark script of the repository loaded as a module, for tests of its pure parts: the
scripts live outside any package (benchmarks/ is run as files, not imported)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_script(relative: str, name: str) -> ModuleType:
    """The file at REPO/relative executed as module ``name`` (kept in sys.modules, so that its
    dataclasses and pickling resolve)."""
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
