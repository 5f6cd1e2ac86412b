"""config.json as users bring it: every fixture config damaged at any key, top level or in
its text_config (a value missing, null, of another type, negative, huge), sizes and plans, or
ends in a ModelError or PlanError (one line at the CLI); never another exception."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.errors import ModelError, PlanError
from launcher.model.modelspec import spec_from_config
from launcher.planner.plan import Policy, plan
from launcher.probe.topology import load_topology
from tests.launcher.paths import MODELS, topo

# the golden fixtures' configs and the recent families' (tests/fixtures/recent-models: hybrid
# Mamba and linear attention, chunked attention, nested text configs, ModelOpt quantization)
CONFIGS = {p.parent.name: json.loads(p.read_text())
           for folder in (MODELS, MODELS.parent / "recent-models")
           for p in sorted(folder.glob("*/config.json"))}
TOPOLOGY = load_topology(topo("2x3090-nvlink-x8x8"), {})

_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 40), 1 << 40), st.floats(allow_nan=True),
    st.text(max_size=8), st.lists(st.integers(-3, 9), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(-3, 9), max_size=3), st.just("ERR"),
)
_DELETE = object()


@st.composite
def damaged(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(sorted(CONFIGS)))
    cfg = json.loads(json.dumps(CONFIGS[name]))
    for _ in range(draw(st.integers(1, 3))):
        where = cfg
        if isinstance(cfg.get("text_config"), dict) and draw(st.booleans()):
            where = cfg["text_config"]
        if not where:
            continue
        key = draw(st.sampled_from(sorted(where)))
        value = draw(st.one_of(st.just(_DELETE), _VALUES))
        if value is _DELETE:
            del where[key]
        else:
            where[key] = value
    return name, cfg


# 150 a run: each builds its model through transformers and plans it (~0.1 s on CI's two cores)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged())
def test_a_damaged_config_plans_or_is_refused_with_a_reason(case: tuple[str, dict[str, Any]]
                                                            ) -> None:
    name, cfg = case
    try:
        m = spec_from_config(cfg, name)
        plan(TOPOLOGY, m, Policy())
    except (ModelError, PlanError) as exc:
        message = str(exc).strip()
        assert message
        assert "\n" not in message


def test_the_fixture_configs_are_many() -> None:
    assert len(CONFIGS) >= 15


def test_a_config_far_beyond_any_model_is_refused_before_it_is_built() -> None:
    # 2**40 layers: built even on the meta device, this held the planner for minutes.
    cfg = {**CONFIGS["llama-3.1-8b"], "num_hidden_layers": 1 << 40}
    with pytest.raises(ModelError, match="num_hidden_layers"):
        spec_from_config(cfg, "huge")


def test_a_mixture_that_routes_every_token_to_every_expert_plans() -> None:
    # found by the generated configs above: top-8 of 8 experts divided by zero in the cost model
    cfg = {**CONFIGS["mixtral-8x7b"], "num_experts_per_tok": 8}
    h200 = load_topology(topo("h200x2-nvlink"), {})
    p = plan(h200, spec_from_config(cfg, "all-experts"), Policy())
    assert p.predicted.decode_tok_s > 0


def test_more_experts_per_token_than_experts_is_one_line() -> None:
    cfg = {**CONFIGS["mixtral-8x7b"], "num_experts_per_tok": 9}
    with pytest.raises(ModelError, match="9 experts per token of 8"):
        spec_from_config(cfg, "too-many")
