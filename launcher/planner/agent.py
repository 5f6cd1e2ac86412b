"""Planning for coding agents: S sessions that each keep a D-token prefix warm. Pure.

A coding agent resends its whole conversation every turn; what the user waits for is the first
token of a turn at depth D. That is fast only while the session's prefix is still in vLLM's
prefix cache. With S sessions taking turns, vLLM's LRU eviction over a cache that holds fewer
than S prefixes evicts each one before its next turn (the accesses cycle), so every turn pays for
its whole prefix again. This module decides, for the plan's candidate layouts:

- how many D-token sessions each layout's KV cache holds on the GPUs (TP and PP divide the cache
  over their GPUs; replicas each keep their own sessions, so they add no room per session);
- whether an FP8 KV cache (one byte per element: e4m3 from Ada/Hopper on, e5m2 on Ampere, as
  vLLM's kernels take them) makes them fit;
- whether KV offloading to host memory (vLLM's native backend) does, sized from the free RAM,
  with its cost per turn: the prefix copied back over the GPU's PCIe link;
- or whether only a shorter context fits;

with a reason for each, and a predicted time to first token per turn at depth for each option.
The plan serves the fastest of the options that keep all S prefixes at depth D (on the GPUs,
or in host memory with offloading; :func:`choose_option`). A cache holding fewer than S runs the
sessions too, but its LRU evicts every prefix before its next turn (the turns cycle), so each
turn recomputes its whole prefix: that is named with its figure and chosen only where neither a
kept prefix nor a shorter context is possible (a shorter context keeps the prefixes, at
another depth).
That figure is not one session's turn alone: the S sessions' turns run through the simulation of
vLLM's scheduler (:func:`launcher.planner.schedsim.simulate_sessions`: its budget of batched
tokens, chunked prefill, the sequence limit, the KV blocks and the prefix cache, with the
offloading's host tier where there is one). The sessions send as loadgen's agent workload does
(``AgentAsk.think_s``): staggered over one think time, each turn a think time after the
session's previous answer, so they overlap where turns take long and queue where they overlap.
Their turns carry what loadgen's carry (loadgen/agent.py): each resends the previous answer as a
text of its length, not the model's own tokens, so the prefix cache matches the previous prompt
and a turn computes its new tokens and the answer again; the sessions' first turns begin with
one system prompt (``AgentAsk.common_tokens``), cached across sessions;
where the KV room holds fewer prefixes than there are sessions, the pool
evicts them before their next turn, which then recomputes its prefix or, with offloading, copies
it back over PCIe while holding its blocks. The option's figure is the median session's time to
first token at the asked depth, after ``WARM_TURNS`` turns that grew the conversations to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

from launcher.model.modelspec import GIB, ModelSpec
from launcher.planner import costmodel, hardware, kernelcost, memfit
from launcher.planner.asyncsched import vllm_async_scheduling
from launcher.planner.costmodel import Layout
from launcher.planner.layouts import Links, candidate_layout
from launcher.planner.plan import cpu_kv_space as plan_cpu_kv_space
from launcher.planner.plantypes import Candidate, Plan, Policy, label
from launcher.planner.schedsim import (
    SchedulerLimits,
    SessionsResult,
    SimError,
    StepBatch,
    StepTimer,
    Turn,
    simulate_sessions,
)
from launcher.probe.kernels import KernelTable
from launcher.probe.topology import Gpu, Topology

# Share of the host's free memory the offloaded KV may take: the rest is for the OS, vLLM's own
# host buffers (pinned staging, the tokenizer, Python) and the user's editor and tools.
# An assumption, said in the plan.
HOST_OFFLOAD_SHARE = 0.5
# vLLM's FP8 KV kernels: e4m3 needs the FP8 units of Ada (sm 8.9) and Hopper; Ampere (sm 8.x)
# stores e5m2 and converts in the kernel. Older cards: not proposed.
FP8_E4M3_CC = (8, 9)
FP8_MIN_CC = (8, 0)
# Sessions up to this many are an interactive load: vLLM's interactivity mode (fine-grained
# CUDA graphs up to 32 sequences) serves them; more and its throughput default is kept.
INTERACTIVITY_MAX_SESSIONS = 32
# Turns simulated before the one at the asked depth, each one turn shallower: enough for the
# block pool to reach the steady state of sessions taking turns (which prefixes survive a turn
# depends on the turn before; the first turn recomputes every prefix).
WARM_TURNS = 3
# The simulation's limit for one option (steps of vLLM's scheduler over all its turns): past it
# (thousands of sessions, or long prefixes recomputed in many chunks) the plan answers with one
# session's turn alone, and says so, rather than keep `launcher plan` busy for seconds.
SIM_MAX_STEPS = 2000
SIM_MAX_SESSIONS = 256  # per replica: each step's cost grows with the requests it holds

OptionName = Literal["gpu", "fp8", "offload", "shorter"]
# The options that serve what was asked (S sessions at depth D), in the order of what they cost
# besides time: the GPUs' cache at the model's element size (nothing), FP8 KV (some accuracy at
# depth), offloading (host memory and a copy over PCIe each turn). The plan takes the fastest
# predicted turn at depth among them; this order only breaks ties (:data:`EQUAL_TTFT`). A
# shorter context is not among them: it serves another depth, and is chosen only where none of
# these can run.
SERVING: tuple[OptionName, ...] = ("gpu", "fp8", "offload")
# ASSUMED, not fitted: predicted turn TTFTs within 10% of the fastest are taken as equal, and
# between equals the option earlier in SERVING (the one that costs less) is kept. 10% is below
# the plan's own error at depth against issue 24's H200 runs (9 of 12 depth cases within 15%,
# docs/planner.md section 9), so a difference inside it does not justify FP8's accuracy or the
# host memory; the choice is said with every figure.
EQUAL_TTFT = 0.10
# vLLM's scheduler limits where a room was made without its cards' (vllm_defaults on 80 GB+)
DEFAULT_LIMITS = memfit.EngineLimits(8192, 256)
# The sessions a cache holds are counted between turns: no batch of theirs in flight, so a
# sliding-window layer keeps its window's blocks (memfit.layer_blocks with in_flight 0), not
# the window plus two batches of prompt chunks that vLLM's start-up check reserves for a
# running request (that worst case would count a quarter of Gemma 3's sessions at 32K).
AT_REST = 0


@dataclass(frozen=True)
class AgentAsk:
    sessions: int  # agent sessions served at once
    context: int  # the prefix each keeps, in tokens (the depth a turn starts at)
    turn_tokens: int = 512  # new tokens a turn adds (the user's message, tool output)
    gen_tokens: int = 256
    # seconds between a session's answer and its next turn (the agent's tool, the user reading),
    # the sessions starting staggered over one of them, as loadgen --workload agent --think
    # sends them; None: every session sends each turn at the same moment (the worst case)
    think_s: float | None = 1.0
    # the first tokens of every session's conversation, the same in all (an agent's system
    # prompt: loadgen's is a quarter of the first turn, :func:`loadgen_common_tokens`), which
    # a session's first turn finds cached once another session sent them; 0: none assumed
    common_tokens: int = 0

    @property
    def request_tokens(self) -> int:
        """One turn's whole request: the prefix, the new tokens and the answer."""
        return self.context + self.turn_tokens + self.gen_tokens


@dataclass(frozen=True)
class Room:
    """One layout with one KV element size: what it holds and what a turn costs on it."""

    layout: str
    tp: int
    pp: int
    dp: int
    kv_dtype: str  # 'auto' (the model's 16 bits), 'fp8_e4m3' or 'fp8_e5m2'
    held: int  # D-token sessions one replica's GPU cache holds
    need: int  # sessions each replica serves
    kv_budget_bytes: float  # one replica's KV memory
    ttft_warm_s: float  # a turn whose prefix is in the GPU cache
    ttft_cold_s: float  # a turn whose prefix is recomputed
    copy_s: float  # the prefix copied from host memory to the replica's GPUs
    lay: Layout | None = field(default=None, compare=False, repr=False)  # None: the CPU engine
    # vLLM's scheduler limits on the layout's cards (its defaults: memfit.vllm_defaults; the
    # CPU engine's: memfit.CPU_BATCHED_TOKENS)
    limits: memfit.EngineLimits | None = field(default=None, compare=False, repr=False)
    block: int = field(default=memfit.BLOCK_TOKENS, compare=False, repr=False)  # CPU: 128
    # the most memfit's margin keeps back of ``kv_budget_bytes`` (memfit.Fit.cushion); the CPU
    # engine's cache is given outright, so its margin is the fraction alone (memfit.kept_back)
    cushion: float = field(default=math.inf, compare=False, repr=False)
    # the warm and cold turns timed on this model's kernel table through the simulated
    # scheduler (:func:`timed_turn_ttft_s`); False: the roofline's (:func:`turn_ttft_s`)
    timed: bool = field(default=False, compare=False, repr=False)

    @property
    def fits(self) -> bool:
        return self.held >= self.need

    @property
    def kv_bytes(self) -> int:
        return 1 if self.kv_dtype.startswith("fp8") else 2

    @property
    def batched_tokens(self) -> int:
        return (self.limits or DEFAULT_LIMITS).batched_tokens

    def sessions(self, m: ModelSpec, tokens: int) -> int:
        """Whole requests of ``tokens`` one replica's KV cache holds (:func:`sessions_held`)."""
        return sessions_held(m, self.kv_budget_bytes, tokens, self.kv_bytes,
                             self.batched_tokens, cushion=self.cushion, block=self.block)

    def request_bytes(self, m: ModelSpec, tokens: int) -> int:
        """The KV bytes one session of ``tokens`` keeps between turns in this cache (memfit's
        blocks, :data:`AT_REST`)."""
        return memfit.request_kv_bytes(m, tokens, self.batched_tokens, self.kv_bytes,
                                       self.block, AT_REST)


@dataclass(frozen=True)
class Option:
    name: OptionName
    ok: bool  # it can run (a turn fits, the host memory is there); a figure then goes with it
    reason: str
    ttft_s: float | None  # predicted time to first token per turn at depth; None: not possible
    # the sessions' mean of the same turn, where they were simulated together: what the choice
    # ranks by (:func:`choose_option`), as the median hides the session that waits for room
    ttft_mean_s: float | None = None
    # one session's turn alone on the option's room (cached, recomputed, or copied back): the
    # figure every option that runs has, by which the choice ranks where one was not simulated
    alone_s: float | None = None
    # every session's prefix stays (on the GPUs, or in the host tier): False where the cache
    # holds fewer than S and LRU evicts each before its next turn (every turn recomputes)
    keeps_prefixes: bool = True

    @property
    def runs_at_depth(self) -> bool:
        """It runs the S sessions at the asked depth, with a figure (a shorter context runs
        them at another)."""
        return self.ok and self.name in SERVING and self.ttft_s is not None

    @property
    def serves_ask(self) -> bool:
        """It keeps the S sessions' prefixes at the asked depth: what the agent plan is for."""
        return self.runs_at_depth and self.keeps_prefixes

    @property
    def recomputes(self) -> bool:
        """It runs the S sessions at the asked depth, each turn recomputing its prefix."""
        return self.runs_at_depth and not self.keeps_prefixes


@dataclass(frozen=True)
class FlagWish:
    """A vLLM flag the agent plan asks for (words: the flag, then its values) and what for; the
    engine stage keeps it only where the installed vLLM takes it."""

    words: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class AgentPlan:
    ask: AgentAsk
    choice: OptionName
    room: Room  # the chosen layout and KV element size
    context: int  # the depth served: the asked one, or shorter where nothing else fits
    offload_gib: float  # per replica (vLLM's --kv-offloading-size: over all its TP ranks)
    options: tuple[Option, ...]
    rooms: tuple[Room, ...]  # every layout considered, 16-bit and FP8
    reasons: tuple[str, ...]
    flags: tuple[FlagWish, ...]

    @property
    def kv_dtype_bytes(self) -> int:
        return 1 if self.room.kv_dtype.startswith("fp8") else 2


# ------------------------------------------------------------------------------- the cost


def fp8_kv_dtype(gpus: Sequence[Gpu]) -> str | None:
    """The FP8 KV format vLLM runs on every one of ``gpus``; None where one is older than Ampere
    or its compute capability is unknown (nothing is assumed)."""
    ccs = [g.cc for g in gpus]
    if not ccs or any(cc is None or cc < FP8_MIN_CC for cc in ccs):
        return None
    return "fp8_e4m3" if all(cc is not None and cc >= FP8_E4M3_CC for cc in ccs) else "fp8_e5m2"


def turn_ttft_s(m: ModelSpec, lay: Layout, depth: int, new: int,
                batched_tokens: int = 8192) -> tuple[float, float]:
    """(warm, cold) time to first token of one session's turn of ``new`` tokens after ``depth``
    tokens, alone on the replica: warm with the prefix in the cache (the new tokens' GEMMs and
    their attention over the cached prefix: costmodel.prefill_at_depth_s), cold with the whole
    prompt recomputed in the engine's chunks (its attention quadratic in the prompt); each
    plus the request's way in through the layout's host (costmodel.request_host_s)."""
    warm = costmodel.prefill_at_depth_s(m, lay, new, depth, batched_tokens)
    cold = costmodel.prefill_at_depth_s(m, lay, depth + new, 0, batched_tokens)
    way_in = costmodel.request_host_s(lay.host, depth + new)
    return warm + way_in, cold + way_in


def timed_turn_ttft_s(m: ModelSpec, r: Room, ask: AgentAsk,
                      tables: Sequence[KernelTable]) -> tuple[float, float] | None:
    """(warm, cold) time to first token of one session's turn alone at the asked depth, as
    :func:`turn_ttft_s` says them, through the simulated scheduler on this model's kernel
    table for the room's layout (:func:`step_timer`): the steps, way in and first-token
    hand-over every option's simulated figure takes (:func:`simulate_turns`), where
    :func:`turn_ttft_s` is the roofline at the card's datasheet or measured rates. Cold: the
    whole prompt of depth + new tokens on an idle engine; warm: the same after a turn whose
    prompt was the depth (cached, as loadgen's --depth primes it). None where no kernel table
    is kept for the layout (:func:`turn_ttft_s` then stands) or a turn does not fit."""
    assert r.lay is not None
    timer = step_timer(m, r.lay, tables)
    if isinstance(timer, RooflineStep):
        return None
    d, new, gen = ask.context, ask.turn_tokens, ask.gen_tokens
    try:
        cold = simulate_turns(m, r, (Turn(d + new, gen),), 1, think_s=None, offload=False,
                              timer=timer)
        warm = cold if d < 1 else simulate_turns(m, r, (Turn(d, gen), Turn(d + new, gen)), 1,
                                                 think_s=None, offload=False, timer=timer)
    except SimError:
        return None
    return warm.ttft(1 if d >= 1 else 0).p50, cold.ttft(0).p50


def host_stored_bytes(m: ModelSpec, prompt: int, kv_dtype_bytes: int,
                      block: int = memfit.BLOCK_TOKENS) -> int:
    """The host memory vLLM's native KV offloading fills for one session's prompt of ``prompt``
    tokens: every block of every KV group (memfit's padded groups), a sliding-window group's
    whole history too, not only its window. From vLLM 0.32's code (installed here): the
    connector stores prompts only (kv_offload/base.py ``offload_prompt_only``, default True);
    distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py ``_build_store_jobs`` stores
    each non-null block of the chunks the step computed, filtered by the group's
    ``reachable_block_mask``, and v1/core/single_type_kv_cache_manager.py
    ``SlidingWindowManager.reachable_block_mask`` keeps every block (returns None) when the
    alignment is the full-attention groups' one-block chunk and
    ``prefix_cache_retention_interval`` is unset (vLLM's default); each stored block takes
    ``worker_kv_bytes_per_block`` (offloading/config.py: the block's bytes across the group's
    layer tensors, padding included). Only loading is windowed (:func:`host_copy_s`)."""
    return sum(layers * -(-prompt // block) * block * g.bytes_per_token(kv_dtype_bytes)
               for g, layers in memfit.vllm_groups(m))


def host_copy_s(m: ModelSpec, lay: Layout, depth: int, kv_dtype_bytes: int,
                batched_tokens: int = DEFAULT_LIMITS.batched_tokens) -> float:
    """The prefix's KV copied from host memory to one replica: the blocks vLLM holds for it
    (memfit's block model between turns, :data:`AT_REST`: whole blocks, vLLM's padded layer
    groups, a sliding-window layer only its window's), each GPU loading its own share over its
    own PCIe link (NVML's negotiated generation and width, at the planner's PCIe efficiency),
    so the slowest link sets the time. vLLM loads a sliding-window group's window only (0.32,
    distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py: ``_lookup_complete_chunks``
    and ``update_state_after_alloc`` take the last ``GroupOffloadConfig.
    load_window_size_in_chunks`` chunks of a SlidingWindowSpec group, cdiv(window - 1 + the
    hit's padding to a block, block): 64 or 65 blocks for a 1,024-token window of 16-token
    blocks, where memfit's at-rest count is 65), while it stores every block
    (:func:`host_stored_bytes`)."""
    gpus = lay.gpus
    moved = memfit.request_kv_bytes(m, depth, batched_tokens, kv_dtype_bytes,
                                    memfit.BLOCK_TOKENS, AT_REST)
    share = moved / max(1, len(gpus))
    return share / (min(costmodel.pcie_gbs(g) for g in gpus) * 1e9)


@dataclass(frozen=True)
class RooflineStep:
    """The cost model's time of one scheduler step (a :class:`StepTimer`): a step holding prompt
    chunks is a prefill of all its tokens whose attention spans the chunks' (query, key) pairs
    plus one pair per cached token a decoder reads; a step of decoders alone is the cost model's
    decode step at their mean context. A model with chunked-attention layers (Llama 4) reads
    the requests' positions: those layers' keys are each query's own chunk prefix."""

    m: ModelSpec
    lay: Layout
    # decode steps by (sequences, mean context to the block): a turn's hundreds of decode steps
    # differ by a token of context each, and the cost model's card lookups are not free
    _decode: dict[tuple[int, int, int], float] = field(default_factory=dict, compare=False,
                                                       repr=False)
    _prefill: dict[tuple[int, int, int, int], float] = field(default_factory=dict,
                                                             compare=False, repr=False)

    @cached_property
    def reads_spans(self) -> bool:
        """A chunked-attention layer's keys saw with each query's position (schedsim.SpanTimer):
        the simulation hands this timer the requests' positions for such a model only."""
        return self.m.chunked_layers > 0

    def _chunk_blocks(self, batch: StepBatch, queries: int) -> int:
        """A chunked layer's mean keys per query in the step (costmodel.chunked_pairs of its
        positions), to the block as the other keys are; 0 for a model without such layers."""
        pairs = costmodel.chunked_pairs(self.m, batch.spans) if self.reads_spans else None
        return 0 if pairs is None else round(pairs / max(1, queries) / memfit.BLOCK_TOKENS)

    def step_s(self, batch: StepBatch) -> float:
        b = memfit.BLOCK_TOKENS
        if batch.prefill_tokens:  # likewise by tokens and mean keys per token to the block
            t = batch.tokens
            span = round((batch.prefill_pairs + batch.decode_context) / t / b)
            chunk = self._chunk_blocks(batch, t)
            key = (t, span, batch.sampled, chunk)  # the LM head runs for the sampled ones only
            if key not in self._prefill:
                self._prefill[key] = costmodel.prefill_step_s(
                    self.m, self.lay, t, pairs=t * span * b, sampled=batch.sampled,
                    chunk_pairs=t * chunk * b if self.reads_spans else None)
            return self._prefill[key]
        n = max(1, batch.decode_seqs)
        chunk = self._chunk_blocks(batch, n)
        dkey = (n, batch.decode_context // n // b, chunk)
        if dkey not in self._decode:
            self._decode[dkey] = costmodel.decode_step_s(
                self.m, self.lay, n, dkey[1] * b,
                chunk_keys=chunk * b if self.reads_spans else None)
        return self._decode[dkey]

    @cached_property
    def layer_host(self) -> hardware.LayerHost:
        """The model's host work a layer, the same figure the step's host floor takes."""
        return costmodel.layer_host(self.m, self.lay.host)

    def launch_s(self, batch: StepBatch) -> float:
        """The host's launching of the step, as loadsim's roofline step says it, under the
        served engine's CUDA graphs (``lay.graphs``; :meth:`LayerHost.launch_s` of the model's
        layer, as the step's own floor has it): past their range eagerly, layer by layer,
        decoders only or not; within it a decode step's full graph at once, a prompt step's
        pieces with the attention between them."""
        return self.layer_host.launch_s(self.m.num_layers, self.lay.graphs,
                                        batch.prefill_tokens, batch.tokens)


@dataclass(frozen=True)
class CpuStep:
    """The CPU engine's scheduler step (a :class:`StepTimer`) from what ``probe --measure``
    timed on the served engine here (costmodel.cpu_step_overhead): the engine's own cost of a
    step, and the arithmetic of every token the step computes (prompt chunks and decoders) at
    the prefill rate timed here, as costmodel.predict_cpu times one request's; ``pair_s``:
    seconds per (query, key) pair of attention over the context, where it was timed (a prompt
    after a cached context against the same prompt alone: ``probe --measure`` times it,
    costmodel.cpu_attention_pair_s; 0 where a record has none, and the turns at depth are then
    the slow side's floor: -35..-42% at 3k tokens on this project's 2-core machine)."""

    m: ModelSpec
    cores: int
    over: costmodel.CpuStepOverhead
    pair_s: float = 0.0

    def step_s(self, batch: StepBatch) -> float:
        flops = self.over.prefill.flops_s if self.over.prefill else None
        tokens = max(1, batch.prefill_tokens + batch.decode_seqs)
        # the CPU roofline predict_cpu uses (DRAM- or arithmetic-bound)
        forward = costmodel.cpu_forward_s(costmodel.forward_flops(self.m, tokens, batch.sampled),
                                          costmodel.streamed_weight_bytes(self.m, 1),
                                          self.cores, flops)
        pairs = batch.prefill_pairs + batch.decode_context
        return self.over.seconds + forward + self.pair_s * pairs

    @property
    def way_in_s(self) -> float:
        """A request's time before its first step: the timed first token's fixed cost less
        the step it includes (the per-token host cost is the simulation's own)."""
        fixed = self.over.prefill.first_token_s if self.over.prefill else 0.0
        return max(0.0, fixed - self.over.seconds)


def step_timer(m: ModelSpec, lay: Layout, tables: Sequence[KernelTable]) -> StepTimer:
    """This model's kernel table for the layout where one is kept (as the plan's own figures
    use it: :func:`kernelcost.layout_step`, under the layout's CUDA graphs ``lay.graphs``),
    else the roofline (under the same graphs)."""
    names = {g.name for g in lay.gpus}
    table = (kernelcost.table_for(tables, m, lay.tp, next(iter(names)))
             if lay.pp == 1 and len(names) == 1 else None)
    if table is None:
        return RooflineStep(m, lay)
    return kernelcost.layout_step(m, table, lay)


def agent_turns(ask: AgentAsk, context: int | None = None) -> tuple[Turn, ...]:
    """The turns simulated: the conversation growing by a turn's new and answered tokens up to
    the one whose history is ``context`` tokens (the asked depth by default)."""
    d = ask.context if context is None else context
    step = ask.turn_tokens + ask.gen_tokens
    prompts = [d + ask.turn_tokens - i * step for i in range(WARM_TURNS, -1, -1)]
    return tuple(Turn(p, ask.gen_tokens) for p in prompts if p >= ask.turn_tokens)


@dataclass(frozen=True)
class Simulated:
    """The S sessions' turns through the simulated scheduler on one room."""

    turns: tuple[Turn, ...]
    result: SessionsResult

    @property
    def ttft_s(self) -> float:
        """The median session's time to first token of the last turn (at the asked depth)."""
        return self.result.ttft(len(self.turns) - 1).p50

    @property
    def ttft_mean_s(self) -> float:
        """The sessions' mean time to first token of the last turn: a session that waits for
        room one turn in S counts, which the median leaves out."""
        return self.result.ttft(len(self.turns) - 1).mean

    def line(self, ask: AgentAsk) -> str:
        cells = []
        for i, t in enumerate(self.turns):
            hit = self.result.hit(i, t.prompt)
            cells.append(f"{t.prompt - ask.turn_tokens:,}: {_ms(self.result.ttft(i).p50)} "
                         f"({hit:.0%} cached)")
        return "; ".join(cells)


def simulate_room(m: ModelSpec, r: Room, ask: AgentAsk, sessions: int, *, offload: bool,
                  context: int | None = None, tables: Sequence[KernelTable] = (),
                  limits: memfit.EngineLimits | None = None) -> Simulated | None:
    """``sessions`` sessions' turns on one replica of ``r`` (None: a turn does not fit its KV
    cache at all). ``offload``: a host tier holds every prefix, copied back over PCIe."""
    assert r.lay is not None
    if sessions > SIM_MAX_SESSIONS:
        return None
    turns = agent_turns(ask, context)
    common = min(ask.common_tokens, turns[0].prompt)
    try:
        res = simulate_turns(m, r, turns, sessions, think_s=ask.think_s, offload=offload,
                             common_tokens=common, tables=tables, limits=limits)
    except SimError:
        return None
    return Simulated(turns, res)


def simulate_turns(m: ModelSpec, r: Room, turns: Sequence[Turn], sessions: int, *,
                   think_s: float | None, offload: bool, common_tokens: int = 0,
                   tables: Sequence[KernelTable] = (),
                   limits: memfit.EngineLimits | None = None, max_steps: int = SIM_MAX_STEPS,
                   timer: StepTimer | None = None,
                   request_overhead_s: float | None = None) -> SessionsResult:
    """``sessions`` sessions sending ``turns`` as loadgen's agent workload sends them, through
    the simulation of one replica of ``r``'s scheduler: the one path of the agent plan's
    figures and of their checks against loadgen's runs. Each turn resends the previous answer
    as other tokens (only the previous prompt is cached, loadgen/agent.py); the first turns
    begin with ``common_tokens`` shared by every session. ``timer``: the step's cost (default:
    the layout's, :func:`step_timer`, under its CUDA graphs ``r.lay.graphs``; the CPU
    engine's: :class:`CpuStep`); ``offload``: a host tier holds every prefix, copied back over
    PCIe. A request's way in before its first step:
    ``request_overhead_s`` (default the layout's host profile's ``request_fixed_s``: the one
    ``probe --measure`` timed on the serving host, else the shipped one, 4.5 ms; the CPU
    engine's: ``CpuStep.way_in_s``) plus its prompt's tokens at the same profile's
    ``prompt_token_s`` (shipped: 1.09 us), cached or not, as :func:`turn_ttft_s` charges them.
    The engine schedules asynchronously where vLLM does by default
    (:func:`asyncsched.vllm_async_scheduling`: a GPU replica without pipeline stages).
    A SimError where a turn does not fit the KV cache or the simulation passes ``max_steps``
    (0: no limit)."""
    lim_e = limits or r.limits or DEFAULT_LIMITS
    block = r.block
    # memfit's pool at the room's element size, counted in the simulation's blocks for the
    # longest turn (sliding windows and block rounding as vLLM counts them)
    pool = memfit.pool_blocks(m, r.kv_budget_bytes, r.kv_bytes, block)
    longest = max(t.prompt + t.gen for t in turns)
    blocks = memfit.scheduler_blocks(m, pool, longest, lim_e.batched_tokens, r.kv_bytes, block,
                                     AT_REST)
    per_block = None
    if offload:  # what vLLM moves for the longest turn, over the simulation's blocks of it
        assert r.lay is not None
        per_block = (host_copy_s(m, r.lay, longest, r.kv_bytes, lim_e.batched_tokens)
                     / -(-longest // block))
    if timer is None:
        assert r.lay is not None
        timer = step_timer(m, r.lay, tables)
    # the served engine schedules asynchronously where vLLM does by default: a GPU replica
    # without pipeline stages, not the CPU engine (the load simulation's rule)
    lim = SchedulerLimits(lim_e.batched_tokens, lim_e.max_num_seqs, blocks, block,
                          async_scheduling=vllm_async_scheduling(gpu=r.lay is not None, pp=r.pp))
    host = r.lay.host if r.lay is not None else hardware.SERVER_HOST
    # the API server loop's work, shared but for its last stage, the hand-over, which goes
    # one request after another (schedsim._FrontEnd)
    request_split = hardware.loop_split(host.request_s)
    token_split = hardware.loop_split(host.prompt_token_s)
    return simulate_sessions(
        lim, timer, turns, sessions, host_copy_s_per_block=per_block,
        request_overhead_s=host.request_fixed_s if request_overhead_s is None
        else request_overhead_s, max_steps=max_steps, think_s=think_s,
        overhead_s_per_prompt_token=host.prompt_token_s,
        request_shared_s=request_split[0], shared_s_per_prompt_token=token_split[0],
        request_serial_s=request_split[1], serial_s_per_prompt_token=token_split[1],
        common_tokens=common_tokens, answers_cached=False)


def loadgen_common_tokens(first_prompt: int, system_tokens: int | None = None) -> int:
    """The system prompt loadgen's agent workload opens every session with: its
    --system-tokens where given (0: none), else a quarter of the first turn's tokens
    (loadgen/agent.py ``system_tokens``; tests hold the two equal)."""
    return max(1, first_prompt // 4) if system_tokens is None else system_tokens


def sessions_held(m: ModelSpec, kv_budget: float, tokens: int, kv_dtype_bytes: int,
                  batched_tokens: int, *, cushion: float,
                  block: int = memfit.BLOCK_TOKENS) -> int:
    """Whole sessions of ``tokens`` a replica's KV memory holds between turns, less memfit's
    margin (:func:`memfit.usable_kv`, at most ``cushion``): the pool's blocks over the blocks one
    session keeps, as memfit counts them for any element size (:func:`memfit.pool_blocks`,
    :func:`memfit.request_blocks`: block rounding, vLLM's padded layer groups, sliding windows;
    :data:`AT_REST`)."""
    per = memfit.request_blocks(m, tokens, batched_tokens, kv_dtype_bytes, block, AT_REST)
    pool = memfit.pool_blocks(m, memfit.usable_kv(kv_budget, cushion), kv_dtype_bytes, block)
    return memfit.requests_held(pool, per)


def rooms(topo: Topology, m: ModelSpec, policy: Policy, cands: Sequence[Candidate],
          ask: AgentAsk) -> list[Room]:
    """Every candidate that fits the model, at its own KV size and, where the GPUs run it, FP8;
    each layout under the CUDA graphs the policy's engine captures on its GPUs
    (:attr:`Policy.cuda_graphs`, as the plan's own layouts), which every figure of the room
    runs its steps and launches under."""
    links = Links(topo, policy.cuda_graphs)
    by_index = {g.index: g for g in topo.gpus}
    out: list[Room] = []
    for c in cands:
        if c.rejected or c.fit is None or not c.gpus:
            continue
        base_bytes = c.fit.kv_dtype_bytes
        fp8 = fp8_kv_dtype([by_index[i] for i in c.gpus])
        # Candidate.fit sized the cache at the policy's element size (1 byte: the user's own
        # --kv-cache-dtype fp8*); the bytes it holds are the same at any element size.
        dtypes = [((fp8 or "fp8") if base_bytes == 1 else "auto", base_bytes)]
        if base_bytes == 2 and fp8 is not None:
            dtypes.append((fp8, 1))
        lay = candidate_layout(c, topo, links, c.fit.kv_budget)
        warm, cold = turn_ttft_s(m, lay, ask.context, ask.turn_tokens,
                                 c.fit.limits.batched_tokens)
        made = [Room(layout=label(c), tp=c.tp, pp=c.pp, dp=c.dp, kv_dtype=name,
                     held=sessions_held(m, c.fit.kv_budget, ask.request_tokens, nbytes,
                                        c.fit.limits.batched_tokens, cushion=c.fit.cushion),
                     need=-(-ask.sessions // c.dp), kv_budget_bytes=c.fit.kv_budget,
                     ttft_warm_s=warm, ttft_cold_s=cold,
                     copy_s=host_copy_s(m, lay, ask.context, nbytes), lay=lay,
                     limits=c.fit.limits, cushion=c.fit.cushion)
                for name, nbytes in dtypes]
        # where this model's kernel table is kept for the layout, a turn alone is timed as the
        # options' simulated figures are (the table's steps), not on the roofline; one figure
        # for both element sizes, as the roofline's (the table times 16-bit attention)
        timed = timed_turn_ttft_s(m, made[0], ask, policy.kernels) if policy.kernels else None
        if timed is not None:
            made = [replace(r, ttft_warm_s=timed[0], ttft_cold_s=timed[1], timed=True)
                    for r in made]
        out += made
    return out


# ------------------------------------------------------------------------------- the choice


def _best(rs: Sequence[Room]) -> Room:
    """The fastest warm turn; between equals, the fewer GPUs per replica, then more room."""
    return min(rs, key=lambda r: (round(r.ttft_warm_s, 4), r.tp * r.pp, -r.held))


def choose_option(options: Sequence[Option], ask: AgentAsk) -> tuple[OptionName, str]:
    """The option served and why, in words for the plan's last line: the fastest predicted turn
    at depth (the sessions' mean) among the options that keep every session's prefix
    (:attr:`Option.serves_ask`), the cheaper of those within :data:`EQUAL_TTFT` of it
    (:data:`SERVING`'s order); else a shorter context, which keeps them at another depth; else
    the fastest option that runs the sessions recomputing their prefixes every turn (an agent's
    turn then costs its whole prefix again, what this plan exists to avoid, so it comes last)."""
    asked = f"{ask.sessions} session(s) at {ask.context:,}"
    serving = sorted((o for o in options if o.serves_ask), key=lambda o: SERVING.index(o.name))
    recomputing = sorted((o for o in options if o.recomputes),
                         key=lambda o: SERVING.index(o.name))
    # Like with like: the sessions' simulated mean where every compared option has one; where
    # one was not simulated its figure is one session's turn alone, which leaves out the turns'
    # wait for room, so then every option is compared by its turn alone.
    compared = serving or recomputing
    simulated = all(o.ttft_mean_s is not None for o in compared)
    by = "the sessions' mean" if simulated else "one session's turn alone, as not every one " \
        "was simulated"

    def rank_s(o: Option) -> float:
        got = o.ttft_mean_s if simulated else o.alone_s if o.alone_s is not None else o.ttft_s
        return math.inf if got is None else got

    def fastest_of(pool: list[Option]) -> tuple[Option, str]:
        fastest = min(rank_s(o) for o in pool)
        pick = next(o for o in pool if rank_s(o) <= fastest * (1 + EQUAL_TTFT))
        others = [f"{o.name} ~{_ms(rank_s(o))}" for o in pool if o is not pick]
        why = (f"~{_ms(rank_s(pick))} ({by})"
               + (f" (else {', '.join(others)})" if others else ""))
        if rank_s(pick) > fastest:
            why += (f", kept over a turn within {EQUAL_TTFT:.0%} of it as it costs less "
                    "(16-bit KV before FP8 before offloading)")
        return pick, why

    short = next((o for o in options if o.name == "shorter" and o.ok), None)
    if serving:
        pick, why = fastest_of(serving)
        why = (f"the fastest predicted turn at depth, {why}, of the options that keep the "
               f"prefixes of {asked}")
        if short is not None and short.ttft_s is not None:
            why += (f"; a shorter context would be ~{_ms(short.ttft_s)} but does not serve the "
                    "asked depth")
        return pick.name, why
    if short is not None:
        slow = ""
        if recomputing:
            quick = min(recomputing, key=rank_s)
            slow = (f"; {quick.name} would run {asked} at ~{_ms(rank_s(quick))} a turn, "
                    "recomputing each evicted prefix")
        return "shorter", f"as no option keeps the prefixes of {asked} (each is said above){slow}"
    if recomputing:
        pick, why = fastest_of(recomputing)
        return pick.name, (f"no option keeps the prefixes of {asked} and no shorter context "
                           f"fits: the fastest that runs them, every turn recomputing its "
                           f"prefix, {why}")
    raise ValueError(f"{ask.sessions} session(s) do not fit any layout even with a short "
                     "context: ask for fewer --sessions")


def _option_line(o: Option) -> str:
    """An option's line in the plan's reasons, its predicted turn at depth always said."""
    return (f"  option {o.name}: "
            + ("yes" if o.serves_ask else "runs, recomputing each turn's prefix" if o.recomputes
               else "alternative (another depth)" if o.ok else "no")
            + f": {o.reason}; turn TTFT p50 at depth "
            + (f"~{_ms(o.ttft_s)}" if o.ttft_s is not None else "none")
            + (f" (the sessions' mean ~{_ms(o.ttft_mean_s)})" if o.ttft_mean_s is not None
               else ""))


def _arrivals(ask: AgentAsk) -> str:
    if ask.think_s is None:
        return "sending each turn at the same moment (the worst case)"
    if ask.sessions == 1:
        return f"sending a turn {ask.think_s:g} s after its previous answer (--think)"
    return (f"sending a turn {ask.think_s:g} s after their previous answer, started "
            f"{ask.think_s / ask.sessions:g} s apart (as loadgen --think sends them)")


def _ms(s: float) -> str:
    return f"{s * 1000:,.0f} ms"


def shorter_context(m: ModelSpec, r: Room, ask: AgentAsk) -> int:
    """The longest prefix of which ``r.need`` sessions fit the room (0: none)."""
    # the sessions held shrink as the prefix grows: bisect
    return memfit.longest_passing(
        lambda n: r.sessions(m, n + ask.turn_tokens + ask.gen_tokens) >= max(1, r.need),
        ask.context)


def agent_plan(topo: Topology, m: ModelSpec, policy: Policy, base: Plan, ask: AgentAsk,
               host_free_bytes: int | None) -> AgentPlan:
    """The agent plan over ``base``'s candidates. ``host_free_bytes``: the host's free memory
    (None: unknown, and no offloading is proposed)."""
    if ask.request_tokens > m.max_position_embeddings:
        longest = m.max_position_embeddings - ask.turn_tokens - ask.gen_tokens
        raise ValueError(f"--context {ask.context}: with {ask.turn_tokens} new and "
                         f"{ask.gen_tokens} generated tokens a turn is {ask.request_tokens} "
                         f"tokens, past {m.name}'s limit of {m.max_position_embeddings}; "
                         f"at most --context {max(0, longest)}")
    if base.engine == "cpu":
        return cpu_agent_plan(m, policy, ask, topo)
    all_rooms = rooms(topo, m, policy, base.candidates, ask)
    if not all_rooms:
        raise ValueError("no layout of the plan fits the model on the GPUs")
    # the cache as the policy sizes it (16 bits, or the user's own FP8), and FP8 as an option
    sixteen = [r for r in all_rooms if r.kv_bytes == policy.kv_cache_bytes]
    eight = [r for r in all_rooms if r.kv_bytes < policy.kv_cache_bytes]
    s, d = ask.sessions, ask.context
    reasons = [f"agent workload: {s} session(s), each keeping a {d:,}-token prefix; a turn adds "
               f"{ask.turn_tokens} tokens and generates {ask.gen_tokens} "
               f"({ask.request_tokens:,} tokens a request)"]
    reasons += [f"  {r.layout} {r.kv_dtype}: holds {r.held} of the {r.need} session(s) per "
                f"replica on its GPUs; one session's turn at depth alone "
                f"{_ms(r.ttft_warm_s)} cached, {_ms(r.ttft_cold_s)} recomputed"
                + (" (the kernel table's steps through the simulated scheduler)" if r.timed
                   else "") for r in all_rooms]
    sims: dict[str, Simulated | None] = {}
    alone_by: dict[str, float] = {}

    def sim(name: str, r: Room, alone: float, *, offload: bool = False,
            context: int | None = None) -> float:
        """The option's TTFT p50 at depth with the sessions taking their turns; where it is
        not simulated, ``alone`` (one session's turn), said in the reasons."""
        alone_by[name] = alone
        sims[name] = simulate_room(m, r, ask, r.need, offload=offload, context=context,
                                   tables=policy.kernels)
        got = sims[name]
        return got.ttft_s if got is not None else alone

    options: list[Option] = []
    on: dict[OptionName, Room] = {}  # the room each option that can run runs on
    fit16 = [r for r in sixteen if r.fits]
    fit8 = [r for r in eight if r.fits]

    def roomiest_of(rs: Sequence[Room]) -> Room:
        return max(rs, key=lambda r: (r.held / r.need, -r.ttft_warm_s))

    def evicting(name: OptionName, r: Room, what: str) -> Option:
        """The option on a cache that holds fewer prefixes than sessions: it runs the sessions
        at the asked depth where it holds one whole turn, recomputing each evicted prefix on
        its next turn and the turns waiting for room (:attr:`Option.recomputes`), else it
        cannot run at all (vLLM keeps a running request's KV wholly on the GPUs)."""
        if r.held < 1:
            return Option(name, False, f"{what}{r.layout} holds {r.held} of {r.need} "
                          f"session(s): not one turn of {ask.request_tokens:,} tokens fits its "
                          "KV cache, so it cannot run", None)
        on[name] = r
        return Option(name, True, f"{what}{r.layout} holds {r.held} of {r.need} session(s): "
                      "with the sessions taking turns the LRU cache evicts each prefix before "
                      "its next turn, which is then recomputed, and the turns wait for room",
                      sim(name, r, r.ttft_cold_s), keeps_prefixes=False)

    # 1. the GPUs' own cache at the model's element size
    if fit16:
        on["gpu"] = r = _best(fit16)
        options.append(Option("gpu", True, f"{r.layout} holds all {r.need} session(s) per "
                              "replica in its GPU cache: every turn after the first hits the "
                              "prefix cache", sim("gpu", r, r.ttft_warm_s)))
    else:
        options.append(evicting("gpu", roomiest_of(sixteen), "the roomiest layout, "))
    # 2. FP8 KV
    if not eight:
        options.append(Option("fp8", False, "FP8 KV cache: not proposed on these GPUs (compute "
                              "capability below 8.0 or unknown)"
                              if policy.kv_cache_bytes == 2 else
                              "FP8 KV cache already asked for (your --kv-cache-dtype)"
                              if policy.kv_cache_given or m.kv_cache_quantized != 1 else
                              "FP8 KV cache already in use (the checkpoint asks for it, and "
                              "vLLM's --kv-cache-dtype auto takes it)", None))
    elif fit8:
        on["fp8"] = r = _best(fit8)
        options.append(Option("fp8", True, f"--kv-cache-dtype {r.kv_dtype}: one byte per KV "
                              f"element, {r.layout} then holds {r.held} session(s) per replica "
                              "(FP8 KV costs a little accuracy on long contexts)",
                              sim("fp8", r, r.ttft_warm_s)))
    else:
        r = roomiest_of(eight)
        options.append(evicting("fp8", r, f"--kv-cache-dtype {r.kv_dtype}: even so "))
    # 3. KV offloading to host memory, on the layout that holds the most of them
    offload_room, offload_gib = _offload(m, sixteen + eight, ask, host_free_bytes, options)
    if offload_room is not None:  # its figure: the sessions' turns with the host tier
        on["offload"] = offload_room
        last = options.pop()
        options.append(replace(last, ttft_s=sim("offload", offload_room, last.ttft_s or 0.0,
                                                offload=True)))
    # 4. a shorter context on the roomiest layout: another depth than the one asked, named with
    # its figure as the alternative, and chosen only where nothing above can run
    roomiest = max(all_rooms, key=lambda r: (shorter_context(m, r, ask), -r.ttft_warm_s))
    shorter = shorter_context(m, roomiest, ask)
    if shorter >= d:
        options.append(Option("shorter", False, "a shorter context: not needed, "
                              f"{roomiest.layout} {roomiest.kv_dtype} holds the sessions at "
                              f"{d:,}", None))
    elif shorter > 0:
        assert roomiest.lay is not None
        on["shorter"] = roomiest
        warm_short = sim("shorter", roomiest,
                         turn_ttft_s(m, roomiest.lay, shorter, ask.turn_tokens)[0],
                         context=shorter)
        options.append(Option("shorter", True, f"--context {shorter:,} instead of {d:,}: "
                              f"{roomiest.layout} {roomiest.kv_dtype} holds {roomiest.need} "
                              "session(s) of that; the agent must compact its history sooner",
                              warm_short))
    else:
        options.append(Option("shorter", False, "no context of any length fits the sessions "
                              f"on {roomiest.layout}: fewer --sessions", None))

    options = [replace(o, alone_s=alone_by.get(o.name),
                       ttft_mean_s=None if (got := sims.get(o.name)) is None
                       else got.ttft_mean_s) for o in options]
    choice, why = choose_option(options, ask)
    room = on[choice]
    context = shorter if choice == "shorter" else d
    chosen = next(o for o in options if o.name == choice)
    for o in options:
        reasons.append(_option_line(o))
        if o.name not in sims:
            continue
        got = sims[o.name]
        if got is None:
            reasons.append(f"    {o.name}: not simulated (more than {SIM_MAX_SESSIONS} sessions "
                           f"a replica or {SIM_MAX_STEPS:,} scheduler steps, or a turn past the "
                           "KV cache): one session's turn alone")
        else:
            reasons.append(f"    {o.name}: {len(got.result.turns[0])} session(s) a replica "
                           f"{_arrivals(ask)} through a simulation of vLLM's scheduler, TTFT "
                           f"p50 by depth: {got.line(ask)}")
    reasons.append(f"agent plan: {choice} on {room.layout}, {why} ({chosen.reason})")
    if room.dp > 1:
        reasons.append(f"{room.dp} replicas each keep their own sessions (the proxy's prefix "
                       "affinity sends a session back to its replica): replicas add throughput, "
                       "not room per session; TP and PP split one cache over their GPUs")
    flags = [FlagWish(("--kv-cache-dtype", room.kv_dtype), "an FP8 KV cache for the sessions' "
                      "prefixes")] if room.kv_dtype.startswith("fp8") and \
        policy.kv_cache_bytes == 2 else []
    if choice == "offload":
        flags.append(FlagWish(("--kv-offloading-size", f"{offload_gib:g}",
                               "--kv-offloading-backend", "native"),
                              "KV offloading to host memory for the sessions the GPUs cannot "
                              "hold"))
    if s <= INTERACTIVITY_MAX_SESSIONS:
        flags.append(FlagWish(("--performance-mode", "interactivity"),
                              f"{s} session(s): latency-first CUDA graphs and kernels"))
    return AgentPlan(ask, choice, room, context, offload_gib if choice == "offload" else 0.0,
                     tuple(options), tuple(all_rooms), tuple(reasons), tuple(flags))


def _offload(m: ModelSpec, rs: Sequence[Room], ask: AgentAsk, host_free_bytes: int | None,
             options: list[Option]) -> tuple[Room | None, float]:
    """Appends the offloading option; (the room it runs on, GiB per replica) when it works."""
    usable = [r for r in rs if r.held >= 1]  # vLLM holds a running request wholly on the GPUs
    if not usable:
        options.append(Option("offload", False, "KV offloading: no layout holds even one "
                              "session on its GPUs, which a running turn needs", None))
        return None, 0.0
    if host_free_bytes is None:
        options.append(Option("offload", False, "KV offloading: the host's free memory is "
                              "unknown (a saved topology without it: save it again with "
                              "`launcher probe --save`, or set TOPOSERVE_HOST_FREE_GIB), so it "
                              "is not sized", None))
        return None, 0.0
    # 16-bit first: offloading trades PCIe time, not accuracy
    r = min(usable, key=lambda x: (x.kv_dtype.startswith("fp8"), -x.held / x.need,
                                   x.ttft_warm_s + x.copy_s))
    # The host tier keeps a copy of every block as it is computed (vLLM's native backend stores
    # them on the way, then serves hits from host memory) and evicts by LRU itself: holding
    # fewer prefixes than there are sessions taking turns, it would miss every time too. So it
    # is sized for all of them, at what vLLM stores (host_stored_bytes: every prompt block of
    # every group, a sliding-window group's too).
    want = r.need * host_stored_bytes(m, ask.context + ask.turn_tokens, r.kv_bytes, r.block)
    room = HOST_OFFLOAD_SHARE * host_free_bytes / r.dp
    gib = math.ceil(want * 1.1 / GIB)
    if gib * GIB > room:
        options.append(Option("offload", False, f"KV offloading: {r.need} prefixes need "
                              f"{gib} GiB of host memory per replica, and "
                              f"{HOST_OFFLOAD_SHARE:.0%} of the {host_free_bytes / GIB:.0f} GiB "
                              f"free is {room / GIB:.0f} GiB", None))
        return None, 0.0
    ttft = r.ttft_warm_s + (r.copy_s if not r.fits else 0.0)
    options.append(Option("offload", True, f"--kv-offloading-size {gib} (GiB, native backend) "
                          f"on {r.layout} {r.kv_dtype}: the GPUs hold {r.held} of {r.need} "
                          f"session(s), host memory the rest ({HOST_OFFLOAD_SHARE:.0%} of "
                          f"{host_free_bytes / GIB:.0f} GiB free allowed); a turn whose prefix "
                          f"was moved out copies it back over PCIe in {_ms(r.copy_s)}"
                          + ("" if r.fits else f", and at most {r.held} turn(s) of that depth "
                             "run at once (vLLM keeps a running request's KV on the GPUs): the "
                             "others wait for room"), ttft))
    return r, float(gib)


def _cpu_simulated(m: ModelSpec, room: Room, ask: AgentAsk, timer: CpuStep) -> Simulated | None:
    """The sessions' turns on the CPU engine (None: too many to simulate, or past its cache)."""
    if ask.sessions > SIM_MAX_SESSIONS:
        return None
    turns = agent_turns(ask)
    try:
        res = simulate_turns(m, room, turns, ask.sessions, think_s=ask.think_s, offload=False,
                             common_tokens=min(ask.common_tokens, turns[0].prompt), timer=timer,
                             request_overhead_s=timer.way_in_s)
    except SimError:
        return None
    return Simulated(turns, res)


def agent_policy(policy: Policy, ap: AgentPlan) -> Policy:
    """The policy that plans the agent plan's layout: its shape forced, its KV element size,
    and a context that holds a whole turn at the served depth."""
    if not ap.room.layout:  # the CPU engine: one process, nothing to force
        return replace(policy, concurrency=ap.ask.sessions)
    # The context stays the longest the cache holds: at least a whole turn, as the room holds one.
    return replace(policy, force_tp=ap.room.tp, force_pp=ap.room.pp, force_dp=ap.room.dp,
                   kv_cache_bytes=ap.kv_dtype_bytes, concurrency=ap.ask.sessions)


def cpu_agent_plan(m: ModelSpec, policy: Policy, ask: AgentAsk, topo: Topology) -> AgentPlan:
    """The CPU engine: its KV cache is host memory already (VLLM_CPU_KVCACHE_SPACE), so there is
    nothing to offload to; FP8 KV is not proposed (vLLM's CPU attention is not measured with it
    here). The sessions fit that cache or the cache must grow, or the context shrink. Where
    ``probe --measure`` timed the served engine here, the sessions' turns go through the
    scheduler's simulation with its timed step (:class:`CpuStep`); else one turn alone."""
    # the cache the CPU plan gives the engine (the user's, or sized for the model and host)
    space = plan_cpu_kv_space(m, policy, topo, policy.nodes).gib
    budget = space * GIB
    over = costmodel.cpu_step_overhead(topo.engine_step, policy.cpu_cores)
    warm = costmodel.predict_cpu(m, policy.cpu_cores, prompt=ask.turn_tokens, gen=1,
                                 concurrency=1, step_overhead_s=over.seconds,
                                 prefill=over.prefill).ttft_s
    cold = costmodel.predict_cpu(m, policy.cpu_cores, prompt=ask.context + ask.turn_tokens,
                                 gen=1, concurrency=1, step_overhead_s=over.seconds,
                                 prefill=over.prefill).ttft_s
    # the CPU engine's blocks of 128 tokens and its batched tokens
    room = Room("", 1, 1, 1, "auto", 0, ask.sessions, budget, warm, cold, 0.0,
                limits=memfit.EngineLimits(memfit.CPU_BATCHED_TOKENS, 256),
                block=memfit.CPU_BLOCK_TOKENS)
    held = room.sessions(m, ask.request_tokens)
    room = replace(room, held=held)
    sim = _cpu_simulated(m, room, ask, CpuStep(m, policy.cpu_cores, over, over.pair_s or 0.0)
                         ) if over.measured and over.prefill is not None else None
    # whole GiB: vLLM's CPU platform reads VLLM_CPU_KVCACHE_SPACE with int()
    need_gib = math.ceil(memfit.budget_holding(ask.sessions * room.request_bytes(
        m, ask.request_tokens), room.cushion) / GIB)
    # as on the GPUs: a cache holding one whole turn at least serves the sessions (the evicted
    # prefixes recomputed, the turns waiting for room); one holding none cannot run them
    options = [
        Option("gpu", held >= 1, f"the CPU engine's KV cache ({space:g} GiB) "
               f"holds {held} of {ask.sessions} session(s)"
               + ("" if room.fits else (", the others' prefixes recomputed each turn" if held
                                        else f": not one turn of {ask.request_tokens:,} "
                                        "tokens fits, so it cannot run")
                  + f"; VLLM_CPU_KVCACHE_SPACE={need_gib:g} would hold them"),
               None if held < 1 else sim.ttft_s if sim is not None
               else warm if room.fits else cold, keeps_prefixes=room.fits),
        Option("fp8", False, "FP8 KV cache: not proposed on the CPU engine", None),
        Option("offload", False, "KV offloading: the CPU engine's cache is host memory already",
               None),
    ]
    shorter = shorter_context(m, room, ask)
    cut = 0 < shorter < ask.context
    options.append(Option("shorter", cut, f"--context {shorter:,} fits the cache as it is" if cut
                          else "a shorter context: not needed" if room.fits
                          else "no context fits: fewer --sessions", warm if cut else None))
    if held < 1 and not cut:
        # as the GPU plan refuses sessions that no layout and no context holds: here the one
        # cache there is can still grow, which is the first fix
        raise ValueError(f"{ask.sessions} session(s) of {ask.request_tokens:,} tokens do not fit "
                         f"the CPU engine's KV cache ({space:g} GiB) even with "
                         f"a short context: set VLLM_CPU_KVCACHE_SPACE={need_gib:g} (GiB of host "
                         "memory) or ask for fewer --sessions")
    choice, why = choose_option(options, ask)  # the GPU plan's rule: shorter only as the last
    context = ask.context if choice == "gpu" else shorter
    reasons = [f"agent workload: {ask.sessions} session(s), each keeping a {ask.context:,}-token "
               "prefix, on the CPU engine"]
    reasons += [_option_line(o) for o in options]
    reasons.append(f"    gpu: {ask.sessions} session(s) {_arrivals(ask)} through a simulation "
                   f"of vLLM's scheduler with the engine step timed here, "
                   + (f"attention over the cached context timed here ({over.pair_s * 1e9:.0f} ns "
                      "a query-key pair" + ("" if over.pair_reliable else
                                            ", the slower side of an unreliable timing") + ")"
                      if over.pair_s is not None else
                      "attention over the cached context not timed "
                      + ("" if over.pair_reliable else "(its timing here unreliable, not kept) ")
                      + "(0 assumed: the deeper turns come out low; `launcher probe --measure` "
                      "times it)")
                   + f", TTFT p50 by depth: {sim.line(ask)}" if sim is not None else
                   "    gpu: one session's turn alone (the engine step is not timed here: "
                   "`launcher probe --measure`)")
    chosen = next(o for o in options if o.name == choice)
    reasons.append(f"agent plan: {choice} on the CPU engine, whose KV cache is host memory, "
                   f"{why} ({chosen.reason})")  # the line the GPU plan ends with
    flags = [FlagWish(("--performance-mode", "interactivity"),
                      f"{ask.sessions} session(s): latency first")
             ] if ask.sessions <= INTERACTIVITY_MAX_SESSIONS else []
    return AgentPlan(ask, choice, room, context, 0.0, tuple(options), (room,), tuple(reasons),
                     tuple(flags))
