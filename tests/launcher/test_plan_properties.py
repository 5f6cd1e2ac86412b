"""Properties of plan() over generated topologies: it returns a plan that fits or a PlanError,
never anything else, and a topology survives its JSON round trip."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.engine.planfile import plan_from_json, plan_to_json
from launcher.engine.render import render
from launcher.errors import PlanError
from launcher.model.modelspec import load_model_spec
from launcher.planner.plan import Plan, Policy, plan
from launcher.probe.topology import (
    P2P_STATUS_NAMES,
    Gpu,
    Pair,
    Topology,
    topology_from_json,
    topology_to_json,
)
from tests.launcher.paths import model

NAMES = [
    "NVIDIA GeForce RTX 3090",
    "NVIDIA GeForce RTX 4090",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA L40S",
    "Mystery Accelerator 9000",
]
MODELS = {
    n: load_model_spec(model(n))
    for n in ["llama-3.3-70b-awq", "qwen2.5-32b", "gemma-3-27b", "mistral-7b", "qwen3-30b-a3b"]
}
STATUS = st.sampled_from([*P2P_STATUS_NAMES.values(), None])


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    n = draw(st.integers(1, 6))
    gpus = tuple(
        Gpu(
            index=i,
            name=draw(st.sampled_from(NAMES)),
            uuid=f"GPU-{i}",
            bus_id=f"00000000:{i + 1:02X}:00.0",
            memory_bytes=draw(st.sampled_from([16, 24, 48, 80, 141])) << 30,
            cc=draw(st.sampled_from([(8, 0), (8, 6), (8, 9), (9, 0), None])),
            pcie_gen_cur=draw(st.sampled_from([1, 3, 4, 5, None])),
            pcie_gen_max=draw(st.sampled_from([3, 4, 5, None])),
            pcie_width_cur=draw(st.sampled_from([1, 4, 8, 16, None])),
            pcie_width_max=16,
        )
        for i in range(n)
    )
    pairs = tuple(
        Pair(
            a=a,
            b=b,
            nvlinks=draw(st.sampled_from([0, 0, 4, 18])),
            common_ancestor=draw(st.sampled_from(["PIX", "PXB", "PHB", "NODE", "SYS", None])),
            p2p_read=draw(STATUS),
            p2p_write=draw(STATUS),
            p2p_nvlink=draw(STATUS),
        )
        for a, b in itertools.combinations(range(n), 2)
    )
    return Topology(gpus=gpus, pairs=pairs, source="generated")


@settings(max_examples=80, deadline=None)
@given(
    topo=topologies(),
    model_name=st.sampled_from(sorted(MODELS)),
    workload=st.sampled_from(["interactive", "throughput"]),
    concurrency=st.integers(1, 128),
)
def test_plan_fits_or_says_why(
    topo: Topology, model_name: str, workload: str, concurrency: int
) -> None:
    m = MODELS[model_name]
    try:
        p: Plan | PlanError = plan(topo, m, Policy(workload=workload, concurrency=concurrency))
    except PlanError as exc:
        p = exc
    if isinstance(p, PlanError):
        assert "GiB" in str(p) or "valid" in str(p)
        return
    assert p.tp * p.pp * p.dp == len(p.gpus)
    assert m.num_heads % p.tp == 0
    chosen = [c for c in p.candidates if (c.tp, c.pp, c.dp, c.gpus) == (p.tp, p.pp, p.dp, p.gpus)]
    assert chosen
    assert chosen[0].need_gib <= chosen[0].budget_gib
    assert p.predicted.decode_tok_s > 0
    assert p.predicted.throughput_tok_s > 0
    r = render(p, "m", served_name=None, host="h", port=1)
    assert plan_from_json(plan_to_json(p, r)).gpus == p.gpus


@settings(max_examples=50, deadline=None)
@given(topo=topologies())
def test_topology_json_round_trip(topo: Topology) -> None:
    assert topology_from_json(topology_to_json(topo), source="generated") == topo
