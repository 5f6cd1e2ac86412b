"""A fresh TOPOSERVE_CACHE for a test, holding only what a cold one would rebuild the same way.

A test gives `launcher` (often a subprocess) a cache of its own so that nothing this machine
kept (a kernel table, a host or engine-step timing) changes what it checks. A cold cache also
rebuilds two things that are pure functions of their inputs: the embedded model (a tokenizer
trained and weights written, tens of seconds) and each model's shape (transformers and torch
imported and the model built on the meta device, ~8 s a process). Those are filled in here
from the session's copies, so the test pays only for what it is about.
"""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock


def fresh_cache(root: Path, *models: str, tiny_model: str | None = None) -> Path:
    """Make ``root`` a cache holding the shapes of ``models`` (counted in this process, where
    transformers is imported once for the suite) and, given ``tiny_model`` (the session's
    embedded model directory), that model under ``root/models``; return ``root``."""
    from launcher.model.modelspec import load_model_spec

    root.mkdir(parents=True, exist_ok=True)
    if tiny_model is not None:
        (root / "models").symlink_to(Path(tiny_model).parent)
        models = (*models, tiny_model)
    with mock.patch.dict(os.environ, {"TOPOSERVE_CACHE": str(root)}):
        for model in models:
            load_model_spec(model)  # writes root/shapes/<digest>.json, as a cold plan would
    return root
