"""Every causal language model the installed transformers defines, at its config class's
defaults: the planner sizes it and plans it on two 24 GB cards, or says in a ModelError or
PlanError why not; never an exception of another kind, and never a model that caches nothing.

This is the world beyond the families the planner was fitted to (about 250 model types in
transformers 5.19): fused QKV projections, latent attention, hybrid and multimodal models.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest

from launcher.errors import ModelError, PlanError
from launcher.model.modelspec import spec_from_config
from launcher.planner.plan import Policy, plan
from launcher.probe.topology import load_topology
from tests.launcher.paths import topo


def _default_configs() -> list[tuple[str, dict[str, Any]]]:
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto

    types = sorted(set(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
                   | set(modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES))
    found = []
    for model_type in types:
        if model_type not in CONFIG_MAPPING:
            continue
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(
                    io.StringIO()):
                cfg = CONFIG_MAPPING[model_type]().to_dict()
        except Exception:  # a config class that has no defaults: not a config anyone ships
            continue
        found.append((model_type, json.loads(json.dumps(cfg, default=str))))
    return found


CONFIGS = _default_configs()


def test_transformers_defines_the_families_this_test_walks() -> None:
    assert len(CONFIGS) > 100


@pytest.mark.parametrize(("model_type", "cfg"), CONFIGS, ids=[t for t, _ in CONFIGS])
def test_a_default_config_of_every_family_plans_or_says_why_not(
        model_type: str, cfg: dict[str, Any]) -> None:
    refusal: Exception | None = None
    try:
        m = spec_from_config(cfg, model_type)
    except ModelError as exc:
        refusal = exc
    if refusal is None:
        assert m.params > 0
        assert m.kv_bytes_per_token(4096) > 0, m.kv_groups
        try:
            chosen = plan(load_topology(topo("2x3090-pcie-x8x8-nop2p"), {}), m, Policy())
        except (PlanError, ModelError) as exc:
            refusal = exc
        else:
            assert chosen.max_model_len > 0
    if refusal is not None:  # one line that says why
        message = str(refusal).strip()
        assert message
        assert "\n" not in message
