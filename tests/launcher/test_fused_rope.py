"""A kernel table's rotary embedding as the served engine runs it past its CUDA graphs: one
Inductor-fused kernel over the query and key heads, costed at the rate the table's norm moves
bytes (issue 22's thirteenth table: the timed five-kernel torch chain put 269 us a layer into
Gemma-3-12B's 8,192-token prompt chunk, where its bytes take ~60 us)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.planner.kernelcost import _at, fused_rope_s, rope_width, step_cost
from launcher.probe.kernels import Attention, KernelTable, KernelTime, Linear, StepShape, TableKey

# hidden 64; 4 query and 2 KV heads of 16: the rope reads and writes 96 elements a token
SHAPE = StepShape("dense", 2, 64, 256, (Linear("qkv", 64, 128), Linear("o", 64, 64)),
                  (Attention(2, 4, 2, 16),))


def table(rope: tuple[float, float], norm: tuple[float, float] = (2e-6, 40e-6),
          eager: bool = False) -> KernelTable:
    """Each op at 1 and 8,192 tokens; ``eager``: those as the eager figures, and graph
    figures at half of them beside them, as a GPU table has both."""
    prefix = "eager:" if eager else ""
    times = [KernelTime(prefix + op, n, s) for op, pts in
             (("norm", norm), ("rope", rope), ("linear:qkv", (1e-5, 1e-4)),
              ("linear:o", (1e-5, 1e-4)))
             for n, s in zip((1, 8192), pts, strict=True)]
    if eager:
        times += [KernelTime(t.op.removeprefix(prefix), t.tokens, t.seconds / 2) for t in times]
    return KernelTable(TableKey("gpu", "d", "v", "t", SHAPE.key()), SHAPE, tuple(times),
                       "synthetic", "now", None, (), ())


def test_the_rope_touches_every_query_and_key_head() -> None:
    assert rope_width(SHAPE) == (4 + 2) * 16


def test_a_long_chunks_rope_costs_its_bytes_at_the_norms_rate_not_the_timed_chain() -> None:
    t = table(rope=(6e-6, 260e-6))
    per_token = (40e-6 - 2e-6) / (8192 - 1)
    fixed = 2e-6 - per_token
    assert fused_rope_s(t, 8192) == pytest.approx(fixed + per_token * 96 / 64 * 8192)
    assert fused_rope_s(t, 1) == pytest.approx(fixed + per_token * 1.5)  # one kernel's launch


def test_a_timed_rope_below_the_fused_estimate_is_kept() -> None:
    t = table(rope=(1e-6, 30e-6))
    assert fused_rope_s(t, 8192) == pytest.approx(30e-6)


def test_eager_figures_cost_the_rope_at_the_eager_norms_rate() -> None:
    t = table(rope=(28e-6, 270e-6), norm=(5e-6, 40e-6), eager=True)
    per_token = (40e-6 - 5e-6) / (8192 - 1)
    assert fused_rope_s(t, 8192, "eager:") == pytest.approx(
        5e-6 - per_token + per_token * 1.5 * 8192)
    assert fused_rope_s(t, 8192) == pytest.approx(fused_rope_s(t, 8192, "eager:") / 2)


def test_steps_past_the_graphs_pay_the_fused_rope_and_steps_within_them_the_timed_one() -> None:
    t = table(rope=(28e-6, 270e-6), norm=(5e-6, 40e-6), eager=True)
    cost = step_cost(t, assumed_step_overhead_s=0.0, max_graph_tokens=512).cost
    # two layers of the two linears, two norms and the rope
    timed = 2 * (1e-4 + 1e-4 + 2 * 40e-6 + 270e-6)
    past = 2 * (1e-4 + 1e-4 + 2 * 40e-6 + fused_rope_s(t, 8192, "eager:"))
    assert cost.forward(8192) == pytest.approx(past)
    assert past < timed
    # within the graphs (the graph figures, half the eager ones): the timed chain
    assert cost.forward_s[-1] == pytest.approx(timed / 2)


# one timing a size, as the table parser accepts (kernels.table_from_json)
_points = st.lists(st.tuples(st.sampled_from((1, 2, 512, 8192)),
                             st.floats(0.0, 1e-2, allow_nan=False)),
                   min_size=1, max_size=4, unique_by=lambda p: p[0])


@settings(max_examples=200, deadline=None)
@given(norm=_points, rope=_points, head=_points, tokens=st.integers(0, 16384))
def test_any_timed_points_give_a_rope_and_head_never_negative_nor_above_the_timed_chain(
        norm: list[tuple[int, float]], rope: list[tuple[int, float]],
        head: list[tuple[int, float]], tokens: int) -> None:
    """Whatever a readable table holds (zero times, points faster at more tokens, one point),
    the fused rope is a finite cost no larger than the timed chain, and the step's
    LM head (the same fixed-and-per-token rule) plans without an error."""
    times = [KernelTime(op, n, sec) for op, pts in (("norm", norm), ("rope", rope),
                                                      ("head", head)) for n, sec in pts]
    times += [KernelTime("linear:qkv", n, 1e-5) for n in (1, 8192)]
    times += [KernelTime("linear:o", n, 1e-5) for n in (1, 8192)]
    t = KernelTable(TableKey("gpu", "d", "v", "t", SHAPE.key()), SHAPE, tuple(times),
                    "synthetic", "now", None, (), ())
    got = fused_rope_s(t, tokens)
    timed = fused_rope_s(t, 0)  # no tokens: the timed chain as read
    assert math.isfinite(got)
    assert got >= 0
    if tokens > 0:
        assert got <= _at(t.lookup("rope"), tokens) + 1e-15
    assert timed >= 0
    cost = step_cost(t, assumed_step_overhead_s=0.0).cost
    assert math.isfinite(cost.forward(512))
    assert cost.forward(512) >= 0
