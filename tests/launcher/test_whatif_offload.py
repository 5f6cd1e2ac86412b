"""The CPU-offload alternative is sized by the one memory fit every plan uses (memfit.fit with
the offloaded bytes): it never counts more weights offloaded than a GPU holds."""

from __future__ import annotations

import re

import pytest

from launcher.errors import PlanError
from launcher.model.modelspec import GIB, load_model_spec
from launcher.planner import memfit
from launcher.planner.plan import Policy, plan
from launcher.probe.topology import load_topology
from tests.launcher.paths import model, topo


def test_offloading_every_weight_is_not_offered_where_the_rest_still_does_not_fit() -> None:
    # 70B over three cards, one of them a 2 GB GT 1030: 1.8 GiB per GPU is less than the
    # overhead and KV alone; the old sum offered 46 GiB of a GPU's 43.8 GiB of weights
    m = load_model_spec(model("llama-3.3-70b"))
    with pytest.raises(PlanError) as err:
        plan(load_topology(topo("2x3090-gt1030-display"), {}), m, Policy())
    assert "Nothing toposerve knows of would fit on these GPUs" in str(err.value)
    assert "CPU offload" not in str(err.value)


def test_an_offload_offered_is_at_most_the_weights_each_gpu_holds() -> None:
    m = load_model_spec(model("llama-3.3-70b"))
    topology = load_topology(topo("2x3090-p2p-x16"), {})
    with pytest.raises(PlanError) as err:
        plan(topology, m, Policy())
    found = re.search(r"CPU offload of (\d+) GiB", str(err.value))
    assert found is not None
    held = max(memfit.weights_per_gpu(m, 2, 1), memfit.weights_per_gpu(m, 1, 2))
    assert 0 < int(found.group(1)) * GIB <= held
