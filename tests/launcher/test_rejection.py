"""A rejected candidate carries why as typed numbers (Rejection); the prose is rendered from them,
and a plan file, which keeps the prose only, gives the same words back."""

from __future__ import annotations

from launcher.engine.planfile import plan_from_json, plan_to_json
from launcher.engine.render import render
from launcher.model.modelspec import load_model_spec
from launcher.planner.plan import Policy, plan
from launcher.planner.plantypes import Rejection
from launcher.probe.topology import load_topology
from tests.launcher.paths import model, topo


def test_a_layout_too_small_for_the_model_is_rejected_with_the_gib_it_needs_and_has() -> None:
    # 70B in 4 bits (~40 GB) on two 24 GB cards: one card is too small, the pair holds it
    p = plan(load_topology(topo("2x3090-p2p-x16"), {}), load_model_spec(model("llama-3.3-70b-awq")),
             Policy())
    single = next(c for c in p.candidates if c.mode == "single")
    r = single.rejection
    assert r is not None
    assert r.kind == "memory"
    assert r.need_gib > r.have_gib > 0
    assert r.weights_gib + r.kv_gib + r.overhead_gib >= r.need_gib - 0.15  # each rounded to 0.1
    assert r.tokens == 4096  # the least context a coding agent works with
    assert r.card == "NVIDIA GeForce RTX 3090"
    assert single.rejected == r.reason
    assert r.reason.startswith(f"needs {r.need_gib} GiB per GPU ({r.weights_gib} weights + ")
    assert f"has {r.have_gib} GiB ({r.utilization:g} × {r.card_gib} GiB of {r.card})" in r.reason
    assert f"rejected one GPU [GPU {single.gpus[0]}]: {r.reason}" in p.reasons


def test_a_tensor_split_the_heads_cannot_take_is_rejected_with_the_head_count() -> None:
    m = load_model_spec(model("llama-3.1-8b"))  # 32 attention heads, 8 KV heads
    p = plan(load_topology(topo("3x3090-one-x4"), {}), m, Policy())
    tp3 = next(c for c in p.candidates if c.tp == 3)
    assert tp3.rejection == Rejection("heads", tp=3, count=m.num_heads)
    assert tp3.rejected == f"TP=3: {m.num_heads} attention heads are not divisible by 3"


def test_a_plan_file_gives_each_rejection_back_in_the_same_words() -> None:
    p = plan(load_topology(topo("2x3090-p2p-x16"), {}), load_model_spec(model("llama-3.3-70b-awq")),
             Policy())
    back = plan_from_json(plan_to_json(p, render(p, "m", served_name=None, host="h", port=1)))
    assert [c.rejected for c in back.candidates] == [c.rejected for c in p.candidates]
    assert {c.rejection.kind for c in back.candidates if c.rejection} == {"recorded"}
