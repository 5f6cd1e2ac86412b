"""A kernel table's chunked-attention layers (Llama 4's RoPE layers, vLLM's ChunkedLocalAttention):
timed as vLLM runs them (the step's queries cut at the chunk boundaries into causal pieces, each
over its own chunk's keys: ``make_local_attention_virtual_batches``), keyed apart from a sliding
window of the same size, and read at each query's own chunk prefix, (p mod C) + 1 keys at position
p, from the requests' positions (launcher/probe/kernels.py Attention.pieces / decode_keys,
launcher/planner/kernelcost.py TableStep). Before, the table timed and read them as sliding
layers: a decoder past the first chunk at a whole chunk's keys, a prompt chunk after a whole
chunk at a window's square instead of the chunk's triangle."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.model.modelspec import KvGroup, ModelSpec, load_model_spec
from launcher.planner.kernelcost import (
    TableStep,
    layout_prediction,
    layout_step,
    step_cost,
    step_shape,
)
from launcher.planner.schedsim import (
    SchedulerLimits,
    StepBatch,
    Workload,
    reads_spans,
    simulate,
)
from launcher.probe.kernels import (
    DECODE_BATCH,
    DECODE_CONTEXTS,
    GPU_PREFILL_CHUNKS,
    PREFILL_CONTEXTS,
    Attention,
    KernelTable,
    KernelTime,
    Linear,
    StepShape,
    TableKey,
    shape_from_json,
    table_from_json,
    table_to_json,
)
from launcher.probe.topology import load_topology
from tests.launcher.paths import REPO, topo

C = 64  # a tiny Llama-4-shaped step: one full-attention layer, three chunked ones
FULL = Attention(1, 4, 2, 16)
CHUNKED = Attention(3, 4, 2, 16, window=C, chunked=True)
SLIDING = replace(CHUNKED, chunked=False)
PAIR_S, KEY_S, FIXED_S = 1e-9, 2e-9, 5e-6
SCOUT = REPO / "tests" / "fixtures" / "recent-models" / "llama-4-scout-17b-16e-instruct"


def _as_run(a: Attention) -> KvGroup:
    """The keys each query of ``a`` reads, as the kernel it is timed by computes them."""
    return KvGroup(1, 1, 1, a.window, chunked=a.chunked)


def _table(attention: tuple[Attention, ...], shape: StepShape | None = None,
           device: str = "gpu") -> KernelTable:
    """A table whose attention points cost a fixed time plus the pairs (prompt chunks) or
    keys (decoders) its kernel computes, as the probe times them at its points."""
    s = shape or StepShape("tiny-llama4", sum(a.layers for a in attention), 64, 256,
                           (Linear("qkv", 64, 128), Linear("o", 64, 64)), attention)
    times = [KernelTime(op, n, 1e-6) for op in ("norm", "rope") for n in (1, 64)]
    for g, a in enumerate(s.attention):
        rule = _as_run(a)
        chunks = [(ctx, 0) for ctx in PREFILL_CONTEXTS] + [
            c for c in GPU_PREFILL_CHUNKS if c[0] not in PREFILL_CONTEXTS or c[1]]
        times += [KernelTime("attn:prefill", n, FIXED_S + PAIR_S * rule.pairs(d, d + n), d + n, g)
                  for n, d in chunks]
        times += [KernelTime("attn:decode", DECODE_BATCH,
                             FIXED_S + KEY_S * DECODE_BATCH * rule.keys(ctx - 1), ctx, g)
                  for ctx in DECODE_CONTEXTS]
    return KernelTable(TableKey(device, "d", "v", "t", s.key()), s, tuple(times), "synthetic",
                       "now", None, (), ())


def test_a_prompt_is_cut_at_the_chunk_boundaries_as_vllms_virtual_batches_cut_it() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.utils import make_local_attention_virtual_batches

    # (new tokens, cached before them) of three requests in one step, 16-token chunks:
    # within a chunk, from mid-chunk over two boundaries, a decoder just past one
    steps = [(5, 0), (40, 10), (1, 16)]
    q = torch.tensor([0, *torch.tensor([n for n, _ in steps]).cumsum(0).tolist()],
                     dtype=torch.int32)
    seq = torch.tensor([n + d for n, d in steps], dtype=torch.int32)
    meta = CommonAttentionMetadata(
        query_start_loc=q, query_start_loc_cpu=q, seq_lens=seq, num_reqs=len(steps),
        num_actual_tokens=int(q[-1]), max_query_len=40, max_seq_len=int(seq.max()),
        block_table_tensor=torch.arange(3 * 8, dtype=torch.int32).view(3, 8),
        slot_mapping=torch.zeros(int(q[-1]), dtype=torch.int64))
    local, _ = make_local_attention_virtual_batches(16, meta, 4)
    vllm_pieces = list(zip((local.query_start_loc_cpu[1:] - local.query_start_loc_cpu[:-1])
                           .tolist(), local.seq_lens.tolist(), strict=True))
    a = Attention(1, 4, 2, 16, window=16, chunked=True)
    ours = [p for n, d in steps for p in a.pieces(n, d)]
    assert ours == vllm_pieces == [(5, 5), (6, 16), (16, 16), (16, 16), (2, 2), (1, 1)]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.integers(0, 300), st.integers(1, 300))
def test_a_chunked_layers_pieces_hold_exactly_the_pairs_its_queries_read(
        chunk: int, depth: int, tokens: int) -> None:
    a = Attention(1, 1, 1, 8, window=chunk, chunked=True)
    pieces = a.pieces(tokens, depth)
    assert sum(n for n, _ in pieces) == tokens
    # each piece causal from its last row: k - n cached keys before its n queries
    pairs = sum(n * (k - n) + n * (n + 1) // 2 for n, k in pieces)
    assert pairs == _as_run(a).pairs(depth, depth + tokens)
    assert all(0 < n <= k <= chunk for n, k in pieces)


def test_a_decoder_reads_its_chunk_up_to_itself_a_sliding_one_its_window() -> None:
    assert [CHUNKED.decode_keys(c) for c in (1, 64, 65, 100, 128, 129)] == [1, 64, 1, 36, 64, 1]
    assert [SLIDING.decode_keys(c) for c in (1, 64, 65, 100)] == [1, 64, 64, 64]
    assert FULL.decode_keys(100) == 100


def test_a_chunked_shape_is_keyed_apart_from_a_sliding_one_and_reads_back_chunked() -> None:
    chunked = StepShape("s", 4, 64, 256, (), (FULL, CHUNKED))
    sliding = StepShape("s", 4, 64, 256, (), (FULL, SLIDING))
    assert chunked.key() != sliding.key()
    back = table_from_json(json.loads(json.dumps(table_to_json(_table((FULL, CHUNKED))))))
    assert back.shape.attention[1].chunked
    # a shape written before the field (no "chunked") is the sliding one, with its own key
    raw = json.loads(json.dumps(table_to_json(_table((FULL, SLIDING)))))
    for a in raw["shape"]["attention"]:
        a.pop("chunked")
    assert shape_from_json(raw["shape"]).key() == raw["key"]["shape"]
    assert not shape_from_json(raw["shape"]).attention[1].chunked


def test_llama4s_step_shape_marks_its_chunked_layers() -> None:
    m = load_model_spec(str(SCOUT))
    att = {(a.window, a.chunked): a.layers for a in step_shape(m, 8).attention}
    assert att == {(8192, True): 36, (None, False): 12}


def _step(attention: tuple[Attention, ...]) -> TableStep:
    cost = step_cost(_table(attention), assumed_step_overhead_s=0.0).cost
    assert isinstance(cost, TableStep)
    return cost


def test_a_decoder_past_its_first_chunk_is_charged_its_own_chunks_prefix() -> None:
    cost = _step((FULL, CHUNKED))
    assert reads_spans(cost)
    assert not reads_spans(_step((FULL, SLIDING)))

    def decode(position: int) -> float:
        b = StepBatch(decode_seqs=1, decode_context=position + 1, sampled=1,
                      spans=((position, position + 1),))
        return cost.decode_attention(b)

    for position in (10, 63, 64, 100, 10_000):  # a layer: its kernel's fixed time, KEY_S a key
        keys = position % C + 1
        expected = 1 * (FIXED_S + KEY_S * (position + 1)) + 3 * (FIXED_S + KEY_S * keys)
        assert decode(position) == pytest.approx(expected, rel=1e-6), position
    # below one chunk as full attention reads; at position 64 the chunked layers read 1 key
    assert decode(64) < decode(63)


def test_a_prompt_chunk_after_a_whole_chunk_costs_the_chunks_triangle_not_a_windows_square(
        ) -> None:
    chunked, sliding = _step((CHUNKED,)), _step((SLIDING,))
    first = StepBatch(prefill_tokens=C, prefill_pairs=C * (C + 1) / 2, sampled=1,
                      spans=((0, C),))
    second = StepBatch(prefill_tokens=C, prefill_pairs=C * (C + C + 1) / 2, sampled=1,
                       spans=((C, 2 * C),))
    assert chunked.chunk_attention(first) > 0
    assert chunked.chunk_attention(second) == chunked.chunk_attention(first)
    assert chunked.prefill_attention(second.prefill_pairs) == 0.0  # no layer of another kind
    # timed and read as sliding, the second chunk cost about twice the first
    assert sliding.prefill_attention(second.prefill_pairs) > 1.9 * sliding.prefill_attention(
        first.prefill_pairs)
    assert chunked.step_s(second) == chunked.step_s(first)


def test_decoders_beside_a_prompt_chunk_keep_their_positions_apart_from_the_chunks() -> None:
    cost = _step((FULL, CHUNKED))
    # a 10-token chunk at position 120 and a decoder at position 64 (its chunk's first key)
    batch = StepBatch(prefill_tokens=10, prefill_pairs=10 * (120 + 5.5), decode_seqs=1,
                      decode_context=65, sampled=1, spans=((120, 130), (64, 65)))
    # beside the chunk no kernel's fixed time: the full layer's 65 keys, the chunked ones' 1
    assert cost.decode_attention(batch) == pytest.approx(KEY_S * (65 + 3 * 1))
    alone = replace(batch, decode_seqs=0, decode_context=0, spans=((120, 130),))
    assert cost.chunk_attention(batch) == cost.chunk_attention(alone)


def test_the_simulation_hands_a_chunked_tables_steps_the_requests_positions() -> None:
    seen: list[StepBatch] = []
    cost = _step((FULL, CHUNKED))

    class Spy:
        reads_spans = True

        def step_s(self, batch: StepBatch) -> float:
            seen.append(batch)
            return cost.step_s(batch)

    lim = SchedulerLimits(max_num_batched_tokens=48, max_num_seqs=4, kv_blocks=64)
    simulate(lim, Spy(), Workload(prompt=100, gen=30, concurrency=3))
    mixed = [b for b in seen if b.prefill_tokens and b.decode_seqs]
    assert mixed
    for b in seen:  # the decoders' spans are the last decode_seqs, one token each
        assert len(b.spans) >= b.decode_seqs
        tail = b.spans[len(b.spans) - b.decode_seqs:]
        assert all(e - a == 1 for a, e in tail)
        assert sum(a + 1 for a, _ in tail) == b.decode_context


def scout() -> ModelSpec:
    return load_model_spec(str(SCOUT))


def _plan(m: ModelSpec, prompt: int) -> tuple[float, float, bool]:
    """Scout's kernel-table prediction (TTFT s, decode tok/s) on 8 H100s at TP 8, its table
    made by :func:`_table` at its step shape; and whether its steps read the positions."""
    from launcher.planner.layouts import Links, Shape, best_candidate
    from launcher.planner.plan import Policy

    t = load_topology(topo("8xh100-nvswitch"), {})
    s = step_shape(m, 8)
    table = _table(s.attention, s, t.gpus[0].name)  # attention and two per-token ops timed
    policy = Policy(prompt_tokens=prompt, gen_tokens=64, max_model_len=prompt + 512,
                    force_tp=8, force_pp=1, force_dp=1)
    _, lay = best_candidate(m, policy, Links(t, policy.cuda_graphs), t.gpus, Shape(8, 1, 1))
    assert lay is not None
    got = layout_prediction(m, (table,), lay, batched_tokens=8192, max_num_seqs=256,
                            prompt=prompt, gen=64, concurrency=1)
    assert got is not None
    return got[0].ttft_s, got[0].decode_tok_s, reads_spans(layout_step(m, got[1], lay))


def as_sliding(m: ModelSpec) -> ModelSpec:
    return replace(m, layer_kv=tuple(replace(g, chunked=False) for g in m.kv_groups))


def test_scouts_kernel_table_plan_is_a_sliding_ones_within_one_chunk_and_faster_past_it(
        ) -> None:
    m = scout()
    chunked, sliding = _plan(m, 4000), _plan(as_sliding(m), 4000)
    assert chunked[2]  # only the chunked table's steps read positions
    assert not sliding[2]
    assert chunked[:2] == pytest.approx(sliding[:2])
    chunked, sliding = _plan(m, 40_000), _plan(as_sliding(m), 40_000)
    assert chunked[0] < sliding[0]  # first token: chunks after the first at their triangle
    assert chunked[1] > sliding[1]  # decode: from 40,000 mod 8,192 + 1 = 7,233 keys, not 8,192
