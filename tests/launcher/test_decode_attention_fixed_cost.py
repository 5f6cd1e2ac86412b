"""A decode step's attention from a kernel table: each layer's kernel costs a fixed time in every
step with decoders, then its keys; a sliding layer reads its context up to its window (issue
22's twelfth H200 table: Gemma-3-12B's kernel-table decode ran +10% fast at one stream and +15%
at 32, the roofline, which charges every kernel and byte, within 1%)."""

from __future__ import annotations

import json
import tarfile
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.planner.cudagraphs import Requested
from launcher.planner.kernelcost import decode_groups, layout_step, step_cost, step_shape
from launcher.planner.schedsim import StepBatch
from launcher.probe.kernels import (
    Attention,
    KernelTable,
    KernelTime,
    StepShape,
    TableKey,
    table_from_json,
)
from tests.launcher.gpushapes import one_gpu, spec
from tests.launcher.paths import REPO

TABLE12 = REPO / "benchmarks" / "gpu" / "results" / "2026-12-04-h200-table12"


def _table(attention: tuple[Attention, ...], decode: list[KernelTime]) -> KernelTable:
    s = step_shape(spec("gemma-3-4b-shape"))
    s = StepShape(s.name, sum(a.layers for a in attention), s.hidden, s.vocab, s.linears,
                  attention, None, s.dtype)
    times = [KernelTime(op, n, 1e-6) for op in ("norm", "rope") for n in (1, 64)]
    return KernelTable(TableKey("gpu", "d", "v", "t", s.key()), s, (*times, *decode),
                       "synthetic", "now", None, (), ())


FULL = Attention(2, 8, 4, 256)
SLIDING = Attention(10, 8, 4, 256, window=1024)
# 4 sequences at 1,024 and 8,192 tokens: 10 us of the kernel's own, 1 ns a key
POINTS = [KernelTime("attn:decode", 4, 10e-6 + 1e-9 * 4 * ctx, ctx, 0) for ctx in (1024, 8192)]


def test_a_decoders_attention_pays_its_kernels_fixed_cost_at_any_context() -> None:
    table = _table((FULL,), POINTS)
    (group,) = decode_groups(table)
    assert group.fixed_s == pytest.approx(10e-6)
    assert group.key_s == pytest.approx(1e-9)
    cost = step_cost(table, assumed_step_overhead_s=0.0).cost
    short = StepBatch(decode_seqs=1, decode_context=100, sampled=1)
    # through the origin the 100-token step would pay 2 x 100 x (42.8 us / 32,768): 0.26 us
    assert cost.decode_attention(short) == pytest.approx(2 * (10e-6 + 100e-9))
    assert cost.decode_attention(StepBatch(prefill_tokens=100, prefill_pairs=5050)) == 0.0


def test_decoders_beside_a_prompt_chunk_share_its_attention_call_and_its_fixed_cost() -> None:
    # vLLM runs a step's chunks and decoders in one attention call a layer: the chunk's timed
    # time holds that call's fixed cost, the decoders add their keys
    cost = step_cost(_table((FULL,), POINTS), assumed_step_overhead_s=0.0).cost
    mixed = StepBatch(prefill_tokens=100, prefill_pairs=5050, decode_seqs=1, decode_context=100)
    assert cost.decode_attention(mixed) == pytest.approx(2 * 100e-9)


def test_a_sliding_layer_reads_its_context_below_its_window_and_its_window_above() -> None:
    # the sliding group's two points both read its window: its per-key cost is the full
    # group's (the same kernel: query and KV heads, head dim), the rest of its time fixed
    sliding = [KernelTime("attn:decode", 4, 6e-6 + 1e-9 * 4 * 1024, ctx, 1) for ctx in (1024, 8192)]
    table = _table((FULL, SLIDING), POINTS + sliding)
    _, group = decode_groups(table)
    assert (group.fixed_s, group.key_s, group.window) == pytest.approx((6e-6, 1e-9, 1024))
    # 32 sequences of 640 tokens: every key of each, as a full layer reads them
    assert group.seconds(32, 32 * 640) == pytest.approx(10 * (6e-6 + 1e-9 * 32 * 640))
    # 4 of 16,384: a window's worth each
    assert group.seconds(4, 4 * 16384) == pytest.approx(10 * (6e-6 + 1e-9 * 4 * 1024))


def test_a_sliding_group_with_no_full_group_of_its_kernel_is_read_per_key() -> None:
    sliding = [KernelTime("attn:decode", 4, 8e-6, ctx, 0) for ctx in (1024, 8192)]
    (group,) = decode_groups(_table((SLIDING,), sliding))
    assert (group.fixed_s, group.key_s) == pytest.approx((0.0, 8e-6 / 4096))


@cache
def _table12(shape: str) -> KernelTable:
    with tarfile.open(TABLE12 / "kernels.tgz") as tar:
        for member in tar.getmembers():
            f = tar.extractfile(member)
            if f is not None and (raw := json.load(f))["shape"]["name"] == shape:
                return table_from_json(raw)
    raise LookupError(shape)


@pytest.mark.parametrize(("shape", "itl_s"), [
    # the twelfth table's single-stream runs (512-token prompts, 256 out): mean ITL
    ("gemma-3-12b-shape", 7.823e-3),
    ("qwen3-8b-shape", 4.936e-3),
    ("phi-4-shape", 8.470e-3),
])
def test_a_single_streams_decode_step_from_the_twelfth_tables_kernels_is_within_5pct(
        shape: str, itl_s: float) -> None:
    m = spec(shape)
    step = layout_step(m, _table12(shape), one_gpu(m, Requested(512)))
    got = step.step_s(StepBatch(decode_seqs=1, decode_context=640, sampled=1))
    assert got == pytest.approx(itl_s, rel=0.05)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.integers(1, 131072),
                          st.floats(0.0, 1.0, allow_nan=False)), min_size=1, max_size=6),
       st.sampled_from([None, 512, 1024, 4096]),
       st.integers(1, 64), st.integers(0, 200_000), st.integers(0, 200_000))
def test_any_timed_decode_points_give_a_cost_never_negative_nor_falling_with_more_keys(
        points: list[tuple[int, int, float]], window: int | None, seqs: int, ctx_a: int,
        ctx_b: int) -> None:
    # whatever a probe timed (repeated contexts, a slower point at fewer keys, zero times), the
    # line read off it charges no negative time, and a step reading more keys never costs less
    attention = Attention(3, 8, 4, 128, window=window)
    timed = [KernelTime("attn:decode", n, sec, ctx, 0) for n, ctx, sec in points]
    for group in decode_groups(_table((attention,), timed)):
        assert group.fixed_s >= 0
        assert group.key_s >= 0
        lo, hi = sorted((ctx_a, ctx_b))
        assert 0 <= group.seconds(seqs, lo) <= group.seconds(seqs, hi)
