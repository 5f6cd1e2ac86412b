"""The agent plan's simulated turns carry what loadgen's agent workload sends (issue 24): the
previous answer comes back as other tokens and is computed again, one system prompt opens every
session and is cached across them, and a prefix copied back from host memory is the blocks vLLM
holds for it (memfit's block model: Gemma's sliding windows and padded layer groups)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from launcher.model.modelspec import GIB, ModelSpec, load_model_spec
from launcher.model.tinymodel import ensure_tiny_model
from launcher.planner import agent, costmodel, memfit
from launcher.planner.plan import plan
from launcher.planner.plantypes import Policy
from launcher.planner.schedsim import SchedulerLimits, SimError, TableStepCost, Turn
from launcher.planner.schedsim import simulate_sessions as sessions_sim
from launcher.probe import enginestep
from launcher.probe.attentionfit import DepthPair
from launcher.probe.topology import Topology, load_topology
from loadgen.agent import build_conversations
from loadgen.config import Config
from loadgen.tokens import Messages
from tests.launcher.paths import H200, model

STEP = TableStepCost(tokens=(1, 8192), forward_s=(0.01, 0.08))
ROOMY = SchedulerLimits(8192, 256, 100_000, 16)


class WordCounter:
    """A tokenizer of one token a word, with a Llama-3-like template: BOS, four tokens of
    header a message, three of generation prompt."""

    source = "tokenizer"
    exact = True

    def text(self, prompt: str) -> int:
        return len(prompt.split())

    def chat(self, messages: Messages) -> int:
        return 1 + sum(4 + len(m["content"].split()) for m in messages) + 3


def test_a_resent_answer_is_computed_again_and_only_the_previous_prompt_is_cached() -> None:
    turns = [Turn(2000 + i * 4064, 64) for i in range(3)]
    text = sessions_sim(ROOMY, STEP, turns, 2, think_s=1.0, answers_cached=False)
    own = sessions_sim(ROOMY, STEP, turns, 2, think_s=1.0)
    for k in (1, 2):
        for r in text.turns[k]:
            assert r.cached_tokens == turns[k - 1].prompt // 16 * 16
        for r in own.turns[k]:  # the model's own answer resent: it hits too
            assert r.cached_tokens == (turns[k - 1].prompt + 63) // 16 * 16
        assert text.ttft(k).p50 > own.ttft(k).p50


def test_a_system_prompt_common_to_the_sessions_is_cached_for_the_later_first_turns() -> None:
    turns = [Turn(2000, 64), Turn(6064, 64)]
    res = sessions_sim(ROOMY, STEP, turns, 4, think_s=1.0, common_tokens=500,
                       answers_cached=False)
    first = res.turns[0]
    assert first[0].cached_tokens == 0  # the first session computes it
    assert [r.cached_tokens for r in first[1:]] == [496] * 3  # whole blocks of it
    alone = sessions_sim(ROOMY, STEP, turns, 4, think_s=1.0, answers_cached=False)
    assert all(r.cached_tokens == 0 for r in alone.turns[0])
    assert res.ttft(0).p50 < alone.ttft(0).p50
    # the second turn hits its own previous prompt, system prompt included
    assert [r.cached_tokens for r in res.turns[1]] == [2000] * 4
    with pytest.raises(SimError, match="common first tokens"):
        sessions_sim(ROOMY, STEP, turns, 4, common_tokens=2001)


def test_the_planner_mirrors_loadgens_agent_conversation() -> None:
    """loadgen's conversations, built with a tokenizer of one token a word: the system prompt
    common to the sessions is the planner's loadgen_common_tokens (and the BOS token before
    it), each turn resends the previous messages (the cache's match) and adds the answer as a
    text of --gen tokens less its header, which the simulated turns compute again."""
    first, gen = 2000, 64
    cfg = Config(workload="agent", chat=True, sessions=2, turns=3, gen=gen, seed=7)
    convs, counts = build_conversations(WordCounter(), cfg, (first, 10_000))
    system = convs[0][0][0]
    assert system["role"] == "system"
    assert all(c[0][0] == system for c in convs)
    common = 1 + 4 + len(system["content"].split())
    assert common - 1 == agent.loadgen_common_tokens(first)
    for conv, row in zip(convs, counts, strict=True):
        assert row[0] == first
        for before, after in itertools.pairwise(conv):
            assert after[:len(before)] == before  # the previous prompt is the new one's start
            answer = after[len(before)]
            assert answer["role"] == "assistant"
            assert 4 + len(answer["content"].split()) == gen  # the answer's tokens as text


def test_a_prefix_copied_from_host_memory_is_the_blocks_vllm_holds_for_it() -> None:
    g = load_topology(str(H200), {}).gpus[0]
    one = costmodel.Layout(1, 1, 1, ((g,),), costmodel.NO_LINK, costmodel.NO_LINK, 1e11)
    rate = costmodel.pcie_gbs(g) * 1e9
    llama = load_model_spec(model("llama-3.1-8b"))
    assert agent.host_copy_s(llama, one, 32_000, 2) == pytest.approx(
        llama.kv_bytes(32_000) / rate)  # whole blocks, no window: the plain bytes
    gemma = load_model_spec(model("gemma-3-27b"))
    moved = agent.host_copy_s(gemma, one, 32_000, 2) * rate
    at_rest = memfit.request_kv_bytes(gemma, 32_000, agent.DEFAULT_LIMITS.batched_tokens, 2,
                                      memfit.BLOCK_TOKENS, agent.AT_REST)
    assert moved == pytest.approx(at_rest)
    # vLLM pads Gemma 3's 52 sliding layers to 60 (groups of its 10 full layers' size), each
    # holding its window's blocks and one more: more than the model's plain KV bytes
    assert moved > 1.02 * gemma.kv_bytes(32_000)


def timed_cpu(m: ModelSpec) -> Topology:
    """A CPU machine on which `probe --measure` timed the engine: a 4 ms step, a first token of
    12 ms + 30 us per prompt token (the tiny model's figures on two cores)."""
    key = enginestep.StepKey("cpu: test CPU (2 threads)", "0.32.0", "2.13.0+cpu")
    step = enginestep.EngineStep(key, 0.004, (0.004,), m.active_params,
                                 int(costmodel.streamed_weight_bytes(m, 1)), "now", 0.012, 30e-6,
                                 model_token_params=m.token_params,
                                 model_head_params=m.lm_head_params)
    return Topology(gpus=(), engine_step=step)


def test_the_cpu_agent_plan_simulates_the_sessions_with_the_engine_step_timed_here() -> None:
    m = load_model_spec(str(ensure_tiny_model()))
    ask = agent.AgentAsk(3, 2000, 300, 16, think_s=0.3, common_tokens=200)
    timed = agent.cpu_agent_plan(m, Policy(cpu_cores=2), ask, timed_cpu(m))
    assert any("simulation of vLLM's scheduler with the engine step timed here" in r
               for r in timed.reasons), timed.reasons
    gpu = next(o for o in timed.options if o.name == "gpu")
    assert gpu.ttft_s is not None
    # staggered sessions at the CPU engine's speed overlap little: near one turn alone,
    # which the timed line gives as 12 ms + 316 new tokens' arithmetic (less than cold)
    assert timed.room.ttft_warm_s * 0.9 < gpu.ttft_s < timed.room.ttft_cold_s
    together = agent.cpu_agent_plan(m, Policy(cpu_cores=2), replace(ask, think_s=None),
                                    timed_cpu(m))
    queued = next(o for o in together.options if o.name == "gpu").ttft_s
    assert queued is not None
    assert queued > gpu.ttft_s  # sent at once, the sessions queue
    untimed = agent.cpu_agent_plan(m, Policy(cpu_cores=2), ask, Topology(gpus=()))
    assert any("one session's turn alone" in r for r in untimed.reasons)


def test_the_cpu_agent_plan_adds_attention_over_the_context_where_probe_timed_it() -> None:
    """A record with probe's timing at depth (512 new tokens after 2,048 cached, 300 ns a pair
    over them) makes the deep turns slower than the same record without it, and says so."""
    m = load_model_spec(str(ensure_tiny_model()))
    ask = agent.AgentAsk(2, 3000, 600, 8, think_s=0.1, common_tokens=150)
    plain = timed_cpu(m)
    assert plain.engine_step is not None
    extra = 512 * 2048 * 300e-9 + 2048 * costmodel.PROMPT_TOKEN_HOST_S
    deep = replace(plain, engine_step=replace(
        plain.engine_step, depth_tokens=2048, depth_new_tokens=512,
        depth_pairs=tuple(DepthPair(0.7, 0.7 + extra, 2048) for _ in range(3))))
    without = agent.cpu_agent_plan(m, Policy(cpu_cores=2), ask, plain)
    with_ = agent.cpu_agent_plan(m, Policy(cpu_cores=2), ask, deep)
    assert any("attention over the cached context timed here (300 ns" in r
               for r in with_.reasons), with_.reasons
    assert any("attention over the cached context not timed" in r for r in without.reasons)
    slow = next(o for o in with_.options if o.name == "gpu").ttft_s
    fast = next(o for o in without.options if o.name == "gpu").ttft_s
    assert slow is not None
    assert fast is not None
    # at least the new tokens' attention over the cached history: 600 x ~2,400 pairs x 300 ns
    assert slow - fast > 0.8 * 600 * 2400 * 300e-9
    # pairs that scatter (one round 4x the others) keep their slower side, and the plan says so
    scattered = replace(deep, engine_step=replace(deep.engine_step, depth_pairs=tuple(
        DepthPair(0.7, 0.7 + extra * f, 2048) for f in (0.5, 1.0, 2.0))))
    wide = agent.cpu_agent_plan(m, Policy(cpu_cores=2), ask, scattered)
    assert any("the slower side of an unreliable timing" in r for r in wide.reasons), wide.reasons


def test_offloading_is_sized_for_every_block_vllm_stores_a_sliding_window_layers_too() -> None:
    """vLLM's native offloading stores every prompt block of every group (a sliding-window
    group's whole history: its reachable-block mask keeps all by default) and loads only the
    window back: the host tier is sized from the first, the copy per turn from the second."""
    llama = load_model_spec(model("llama-3.1-8b"))
    gemma = load_model_spec(model("gemma-3-27b"))
    # no window: what a session keeps on the GPUs between turns, block for block
    assert agent.host_stored_bytes(llama, 32_000, 2) == memfit.request_kv_bytes(
        llama, 32_000, agent.DEFAULT_LIMITS.batched_tokens, 2, memfit.BLOCK_TOKENS, agent.AT_REST)
    # Gemma 3: its 52 sliding layers padded to 60 beside 10 full ones, all 32,000 tokens each
    stored = agent.host_stored_bytes(gemma, 32_000, 2)
    assert stored == 70 * 2000 * 16 * gemma.kv_groups[0].bytes_per_token(2)
    window = memfit.request_kv_bytes(gemma, 32_000, agent.DEFAULT_LIMITS.batched_tokens, 2,
                                     memfit.BLOCK_TOKENS, agent.AT_REST)
    assert stored > 4 * window
    # the plan that offloads 64 of Gemma's 120K-token sessions sizes the host tier for that
    m, ask = gemma, agent.AgentAsk(64, 120_000)
    base = plan(load_topology(str(H200), {}), m, Policy())
    ap = agent.agent_plan(load_topology(str(H200), {}), m, Policy(), base, ask, 16_000 * GIB)
    assert ap.choice == "offload"
    per = agent.host_stored_bytes(m, ask.context + ask.turn_tokens, ap.room.kv_bytes)
    assert ap.offload_gib == math.ceil(ap.room.need * per * 1.1 / GIB)
