"""The keys a chunked-attention layer (Llama 4's RoPE layers, vLLM's ChunkedLocalAttention)
reads: a query at position p reads its own chunk's prefix, p mod C + 1 keys, not the last C
as a sliding window of C would (launcher/model/modelspec.py KvGroup.pairs, the one rule;
launcher/planner/costmodel.py attention_work / decode_step_s / predict; the scheduler
simulation's steps through loadsim.RooflineStep). The KV a chunked layer holds stays a chunk
(memfit's sizing, vLLM's ChunkedLocalAttentionSpec)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.model.modelspec import KvGroup, ModelSpec, load_model_spec
from launcher.planner import costmodel
from launcher.planner.agent import RooflineStep as AgentStep
from launcher.planner.costmodel import Layout, attention_work, chunked_pairs, decode_keys
from launcher.planner.loadsim import RooflineStep
from launcher.planner.plan import Policy, plan
from launcher.planner.schedsim import SchedulerLimits, StepBatch, Workload, simulate
from launcher.probe.topology import load_topology
from tests.launcher.paths import H200, REPO, topo

CHUNK = 8192
CHUNKED = KvGroup(36, 8, 128, CHUNK, chunked=True)
SLIDING = KvGroup(36, 8, 128, CHUNK)
FULL = KvGroup(12, 8, 128)
SCOUT = REPO / "tests" / "fixtures" / "recent-models" / "llama-4-scout-17b-16e-instruct"


def scout() -> ModelSpec:
    return load_model_spec(str(SCOUT))


def as_sliding(m: ModelSpec) -> ModelSpec:
    """The same shape with its chunked layers sliding over a window of the chunk."""
    return replace(m, layer_kv=tuple(replace(g, chunked=False) for g in m.kv_groups))


def test_a_decode_step_at_position_10000_reads_1809_keys_chunked_and_8192_sliding() -> None:
    assert CHUNKED.keys(10_000) == 10_000 % CHUNK + 1 == 1809
    assert SLIDING.keys(10_000) == 8192
    assert FULL.keys(10_000) == 10_001
    # the first query of a chunk reads itself only; the chunk's last one the whole chunk
    assert (CHUNKED.keys(8192), CHUNKED.keys(8191), CHUNKED.keys(16_383)) == (1, 8192, 8192)


def test_within_the_first_chunk_a_chunked_layer_reads_what_full_attention_does() -> None:
    assert CHUNKED.pairs(0, 4096) == FULL.pairs(0, 4096) == 4096 * 4097 // 2
    assert CHUNKED.keys_read(100, 4096) == FULL.keys_read(100, 4096) == 4096


def test_a_prompt_chunk_after_a_whole_chunk_attends_within_its_own_chunk() -> None:
    # 8,192 new tokens after 8,192 cached: each query its own chunk's prefix, the causal
    # triangle of one chunk, where a sliding window reads 8,192 keys a query
    assert CHUNKED.pairs(8192, 16_384) == 8192 * 8193 // 2
    assert SLIDING.pairs(8192, 16_384) == 8192 * 8192
    # and it reads no key of the chunk before
    assert CHUNKED.keys_read(8192, 16_384) == 8192
    assert CHUNKED.keys_read(8000, 8400) == 8400


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.integers(0, 400), st.integers(0, 200))
def test_a_chunked_layers_pairs_are_its_queries_keys_each_between_1_and_the_chunk(
        chunk: int, start: int, length: int) -> None:
    g = KvGroup(1, 1, 1, chunk, chunked=True)
    keys = [g.keys(p) for p in range(start, start + length)]
    assert g.pairs(start, start + length) == sum(keys)
    assert all(1 <= k <= min(p + 1, chunk) for p, k in zip(range(start, start + length), keys,
                                                             strict=True))
    # over a whole chunk a query reads (C + 1) / 2 keys on average, half a sliding window's
    whole = start // chunk * chunk
    assert g.pairs(whole, whole + chunk) * 2 == (chunk + 1) * chunk


def test_a_llama4_decoder_at_10001_tokens_reads_its_chunked_layers_chunk_prefix() -> None:
    m = scout()
    read = {(g.chunked, g.window): keys for g, keys in decode_keys(m, 10_001)}
    assert read == {(True, CHUNK): 1809.0, (False, None): 10_001.0}
    # the KV it holds is unchanged: a whole chunk a chunked layer
    per = m.kv_bytes_per_layer_token()
    assert m.kv_bytes(10_001) == per * (12 * 10_001 + 36 * CHUNK)


def test_a_llama4_prompt_chunk_past_the_first_chunk_costs_less_than_a_sliding_ones() -> None:
    m = scout()
    chunked = attention_work(m, 8192, depth=8192)
    sliding = attention_work(as_sliding(m), 8192, depth=8192)
    assert chunked.flops < sliding.flops
    assert chunked.exps < sliding.exps
    # 36 layers of one chunk's triangle against 36 of a full square, beside 12 full layers
    full = FULL.pairs(8192, 16_384)
    assert chunked.exps / sliding.exps == (12 * full + 36 * 8192 * 8193 / 2) / (
        12 * full + 36 * 8192 * 8192)


def test_summed_steps_take_a_chunked_layers_pairs_from_the_queries_positions() -> None:
    m = scout()
    # two decoders at positions 8191 and 8192: 8,192 keys and 1
    spans = [(8191, 8192), (8192, 8193)]
    assert chunked_pairs(m, spans) == 8193.0
    assert chunked_pairs(as_sliding(m), spans) is None
    given_pairs = attention_work(m, 2, pairs=8192 + 8193, chunk_pairs=8193.0)
    capped = attention_work(m, 2, pairs=8192 + 8193)
    assert given_pairs.exps < capped.exps


def test_llama4_decodes_faster_at_100k_than_the_same_shape_with_sliding_layers() -> None:
    topology = load_topology(topo("8xh100-nvswitch"), {})
    policy = Policy(prompt_tokens=100_000, gen_tokens=256, max_model_len=100_512)
    chunked = plan(topology, scout(), policy).predicted
    sliding = plan(topology, as_sliding(scout()), policy).predicted
    assert chunked.decode_tok_s > sliding.decode_tok_s
    assert chunked.ttft_s < sliding.ttft_s


@dataclass
class Recorder:
    """A step timer that keeps the batches it was given."""

    reads_spans: bool
    batches: list[StepBatch] = field(default_factory=list)

    def step_s(self, batch: StepBatch) -> float:
        self.batches.append(batch)
        return 0.01


def test_the_simulation_gives_each_requests_positions_to_a_timer_that_reads_them() -> None:
    # two staggered requests whose decode steps run on together (taken at once: _fast_decode)
    work = Workload(prompt=100, gen=40, concurrency=2)
    lim = SchedulerLimits(max_num_batched_tokens=64, max_num_seqs=8, kv_blocks=64)
    seen = Recorder(True)
    simulate(lim, seen, work)
    for b in seen.batches:
        # the spans are the queries the totals sum, fast-forwarded decode steps' too
        full = sum(FULL.pairs(a, e) for a, e in b.spans)
        assert full == b.prefill_pairs + b.decode_context
        assert sum(e - a for a, e in b.spans) == b.tokens
    assert any(b.prefill_tokens and b.decode_seqs == 0 for b in seen.batches)
    assert sum(b.decode_seqs == 2 and not b.prefill_tokens for b in seen.batches) > 30
    assert seen.batches[-1].spans == ((138, 139),)  # the last decoder's 39th step
    blind = Recorder(False)
    simulate(lim, blind, work)
    assert all(b.spans == () for b in blind.batches)
    assert [replace(b, spans=()) for b in seen.batches] == blind.batches


def one_h200() -> Layout:
    g = load_topology(str(H200), {}).gpus[0]
    return Layout(1, 1, 1, ((g,),), costmodel.NO_LINK, costmodel.NO_LINK, 1e11)


def test_a_simulated_llama4_decode_step_reads_each_decoders_own_chunk_prefix() -> None:
    m, lay = scout(), one_h200()
    step = RooflineStep(m, lay)
    assert step.reads_spans
    assert not RooflineStep(as_sliding(m), lay).reads_spans
    # two decoders at positions 8191 and 8192: one reads a whole chunk, the other itself
    batch = StepBatch(decode_seqs=2, decode_context=8192 + 8193, sampled=2,
                      spans=((8191, 8192), (8192, 8193)))
    assert step.step_s(batch) == costmodel.decode_step_s(m, lay, 2, 8192, chunk_keys=8193 / 2)
    assert step.step_s(batch) < costmodel.decode_step_s(m, lay, 2, 8192)


def test_the_agent_simulations_llama4_steps_read_each_querys_own_chunk_prefix() -> None:
    """The agent plan's step timer (agent.RooflineStep) reads the requests' positions for a
    model with chunked layers, as loadsim's does: a decoder at 10,001 tokens reads its chunk's
    1,809 keys (to the block), so its step is the cost model's at those keys, below a sliding
    layer's; a model without chunked layers gets no positions and is timed as before."""
    m, lay = scout(), one_h200()
    step = AgentStep(m, lay)
    assert step.reads_spans
    assert not AgentStep(as_sliding(m), lay).reads_spans
    batch = StepBatch(decode_seqs=1, decode_context=10_001, sampled=1, spans=((10_000, 10_001),))
    keys = round(1809 / 16) * 16
    assert step.step_s(batch) == costmodel.decode_step_s(m, lay, 1, 10_000, chunk_keys=keys)
    assert step.step_s(batch) < AgentStep(as_sliding(m), lay).step_s(replace(batch, spans=()))
    # a prompt chunk of 4,096 tokens after two whole chunks: the chunk's own triangle
    pre = StepBatch(prefill_tokens=4096, prefill_pairs=4096 * (16_384 + 2048), sampled=1,
                    spans=((16_384, 20_480),))
    sliding = AgentStep(as_sliding(m), lay).step_s(replace(pre, spans=()))
    assert step.step_s(pre) < sliding
