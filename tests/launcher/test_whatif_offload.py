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


def test_an_offload_is_offered_only_where_offloading_the_weights_a_gpu_holds_makes_room() -> None:
    # 70B over three cards, one a 2 GB GT 1030 (1.8 GiB per GPU): the first stage holds 45.0 GiB
    # of weights; the old sum offered 46 GiB of them. What is offered is never more than held.
    m = load_model_spec(model("llama-3.3-70b"))
    with pytest.raises(PlanError) as err:
        plan(load_topology(topo("2x3090-gt1030-display"), {}), m, Policy())
    found = re.search(r"CPU offload of ([\d.]+) GiB", str(err.value))
    held = max(memfit.weights_per_gpu(m, tp, pp) for tp, pp in ((1, 3), (3, 1)))
    assert found is None or float(found.group(1)) * GIB <= held
    # a 70B 4-bit model asked for 131,072 tokens on 2 x 24 GB: the KV alone passes a card, so
    # offloading every weight would not make room, and no offload is offered
    awq = load_model_spec(model("llama-3.3-70b-awq"))
    with pytest.raises(PlanError) as err:
        plan(load_topology(topo("2x3090-nvlink-x8x8"), {}), awq, Policy(max_model_len=131072))
    assert "--cpu-offload-gb" not in str(err.value)


def test_an_offload_offered_is_at_most_the_weights_each_gpu_holds() -> None:
    m = load_model_spec(model("llama-3.3-70b"))
    topology = load_topology(topo("2x3090-p2p-x16"), {})
    with pytest.raises(PlanError) as err:
        plan(topology, m, Policy())
    found = re.search(r"CPU offload of ([\d.]+) GiB", str(err.value))
    assert found is not None
    held = max(memfit.weights_per_gpu(m, 2, 1), memfit.weights_per_gpu(m, 1, 2))
    assert 0 < float(found.group(1)) * GIB <= held
