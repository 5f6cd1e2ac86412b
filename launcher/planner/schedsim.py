"""vLLM's scheduler, simulated over a workload: TTFT and TPOT percentiles and throughput. Pure.

A single-request figure ("prefill tok/s of one prompt") says nothing of what 32 streams or four
long prompts at once will see: vLLM runs them in steps, and what one step holds is the
scheduler's choice. This replays the V1 scheduler's choice step by step
(vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``) and times each step with a
:class:`StepTimer` (the cost model, or measured kernels):

- every step has a budget of ``max_num_batched_tokens`` new tokens. Running requests are
  scheduled first, in order: a decoding one takes one token, one still in its prompt takes as
  much of the rest of it as the budget leaves (chunked prefill: a long prompt goes through in
  budget-sized chunks over several steps, sharing each with the decoders);
- then waiting requests, first come first served, while fewer than ``max_num_seqs`` run, budget
  is left and the KV cache has the blocks. A prompt prefix another request already computed is
  taken from the prefix cache in whole blocks (never the prompt's last token) and not computed;
- a step that finds no block for a running request preempts the last one admitted: its blocks
  are freed and it is recomputed later (vLLM's recompute preemption);
- a request whose tokens are all computed after a step samples one token at the step's end: the
  first is its time to first token, the rest are its decode.

Workloads are either closed loop (``concurrency`` clients, each sending its next request when
the previous ends, as `loadgen --concurrency N` does) or open loop (requests sent at a fixed
rate). Requests are identical in shape; a shared prefix of ``shared_prefix`` tokens is what the
prefix cache can hit. Not modelled: speculative decoding, priorities, several partial prefills
with their own thresholds, blocks shared between requests (each request's cached prefix is
counted in its own blocks: the cache is fuller here than in vLLM, never emptier).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class SimError(ValueError):
    """The workload cannot run under these limits (one request needs more KV than exists)."""


@dataclass(frozen=True)
class SchedulerLimits:
    """vLLM's scheduler settings that shape a step (``SchedulerConfig``, ``CacheConfig``)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    kv_blocks: int  # blocks in the KV pool of one replica (vLLM's "KV cache size" / block size)
    block_size: int = 16
    chunked_prefill: bool = True
    prefix_caching: bool = True
    # vLLM's long_prefill_token_threshold: a prompt chunk never takes more (0: no cap)
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        if min(self.max_num_batched_tokens, self.max_num_seqs, self.kv_blocks,
               self.block_size) < 1:
            raise SimError(f"scheduler limits must be positive: {self}")


@dataclass(frozen=True)
class StepBatch:
    """What one engine step computes: the new tokens of prompt chunks and of decoders."""

    prefill_tokens: int = 0  # new prompt tokens (chunks of one or more prompts)
    # attention work of the chunks: Σ new tokens × the keys each attends to on average
    prefill_pairs: float = 0.0
    decode_seqs: int = 0  # requests advancing by one token
    decode_context: int = 0  # Σ of their contexts: the KV a decode step reads
    sampled: int = 0  # requests that sample a token at the end of the step

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs


class StepTimer(Protocol):
    """Seconds one engine step takes, from what it computes."""

    def step_s(self, batch: StepBatch) -> float: ...


@dataclass(frozen=True)
class TableStepCost:
    """A step time from measured (or modelled) parts.

    ``forward_s[i]`` is the time of everything that scales with the step's tokens (GEMMs,
    fused MoE, norms, all-reduce, per-layer launches) at ``tokens[i]`` tokens; between points it
    is interpolated linearly, past the last point it grows in proportion. Attention is per
    (query, key) pair for prompt chunks and per cached token read for decoders; the sampler per
    sampled row; ``step_overhead_s`` is the host's fixed cost of a step (scheduling, input
    preparation, output processing)."""

    tokens: tuple[int, ...]
    forward_s: tuple[float, ...]
    attn_prefill_s_per_pair: float = 0.0
    attn_decode_s_per_token: float = 0.0
    sampler_s_per_seq: float = 0.0
    step_overhead_s: float = 0.0
    # A step of more tokens than the largest captured CUDA graph runs eagerly, launched from
    # the host: ``eager_forward_s`` (same token counts) then replaces ``forward_s``.
    eager_forward_s: tuple[float, ...] = ()
    max_graph_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.tokens or len(self.tokens) != len(self.forward_s):
            raise SimError("a step cost needs one forward time per token count")
        if self.eager_forward_s and len(self.eager_forward_s) != len(self.tokens):
            raise SimError("a step cost needs one eager forward time per token count")
        if list(self.tokens) != sorted(set(self.tokens)) or self.tokens[0] < 1:
            raise SimError(f"token counts must be positive and ascending: {self.tokens}")
        figures = (*self.forward_s, *self.eager_forward_s, self.attn_prefill_s_per_pair,
                   self.attn_decode_s_per_token,
                   self.sampler_s_per_seq, self.step_overhead_s)
        if not all(math.isfinite(v) and v >= 0 for v in figures):
            raise SimError("step cost figures must be finite and not negative")

    def forward(self, tokens: int) -> float:
        xs, ys = self.tokens, self.forward_s
        if self.eager_forward_s and tokens > self.max_graph_tokens:
            ys = self.eager_forward_s
        if tokens <= 0:
            return 0.0
        if tokens <= xs[0]:
            return ys[0]
        for i in range(1, len(xs)):
            if tokens <= xs[i]:
                x0, y0 = xs[i - 1], ys[i - 1]
                return y0 + (ys[i] - y0) * (tokens - x0) / (xs[i] - x0)
        return ys[-1] * tokens / xs[-1]

    def step_s(self, batch: StepBatch) -> float:
        return (self.step_overhead_s + self.forward(batch.tokens)
                + self.attn_prefill_s_per_pair * batch.prefill_pairs
                + self.attn_decode_s_per_token * batch.decode_context
                + self.sampler_s_per_seq * batch.sampled)


@dataclass(frozen=True)
class Workload:
    """Identical requests: ``prompt`` tokens in, ``gen`` out, ``requests`` of them.

    Closed loop (``rate`` None): ``concurrency`` clients send back to back. Open loop: one
    request every ``1/rate`` seconds, whatever the engine does. The first ``shared_prefix``
    prompt tokens are the same in every request (a system prompt): the prefix cache's hits."""

    prompt: int
    gen: int
    concurrency: int = 1
    requests: int = 0  # 0: one per client (closed loop) / concurrency (open loop)
    rate: float | None = None
    shared_prefix: int = 0

    def __post_init__(self) -> None:
        if self.prompt < 1 or self.gen < 1 or self.concurrency < 1 or self.requests < 0:
            raise SimError(f"a workload needs a prompt, a generation and a client: {self}")
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise SimError(f"an open-loop rate must be a positive number: {self.rate}")

    @property
    def total(self) -> int:
        return self.requests or self.concurrency


@dataclass(frozen=True)
class RequestTiming:
    sent_s: float
    first_token_s: float
    finished_s: float
    gen: int
    cached_tokens: int  # prompt tokens the prefix cache supplied

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.sent_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (0 for a single-token answer)."""
        return (self.finished_s - self.first_token_s) / (self.gen - 1) if self.gen > 1 else 0.0


@dataclass(frozen=True)
class Percentiles:
    mean: float
    p50: float
    p90: float
    p99: float


def percentiles(values: Sequence[float]) -> Percentiles:
    """Linear-interpolated percentiles (numpy's default, and loadgen's)."""
    if not values:
        raise SimError("no values")
    ordered = sorted(values)

    def at(q: float) -> float:
        pos = (len(ordered) - 1) * q / 100.0
        low = math.floor(pos)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)

    return Percentiles(math.fsum(ordered) / len(ordered), at(50), at(90), at(99))


@dataclass(frozen=True)
class SimResult:
    requests: tuple[RequestTiming, ...]
    steps: int
    preemptions: int
    max_running: int  # most requests the scheduler ran at once
    duration_s: float  # first send to last token

    @property
    def ttft(self) -> Percentiles:
        return percentiles([r.ttft_s for r in self.requests])

    @property
    def tpot(self) -> Percentiles:
        return percentiles([r.tpot_s for r in self.requests])

    @property
    def e2e(self) -> Percentiles:
        return percentiles([r.finished_s - r.sent_s for r in self.requests])

    @property
    def output_tok_s(self) -> float:
        """Generated tokens per second over the whole run, as loadgen reports it."""
        gen = sum(r.gen for r in self.requests)
        return gen / self.duration_s if self.duration_s > 0 else 0.0


# ---------------------------------------------------------------------------------- the engine


@dataclass
class _Req:
    """A request inside the simulated engine (mutable: it advances step by step)."""

    sent: float
    prompt: int
    gen: int
    num_tokens: int  # prompt + sampled tokens
    computed: int = 0
    blocks: int = 0
    outputs: int = 0
    cached: int = 0
    first: float = math.nan


@dataclass
class _Engine:
    lim: SchedulerLimits
    free_blocks: int
    waiting: deque[_Req] = field(default_factory=deque)
    running: list[_Req] = field(default_factory=list)
    prefix_computed: int = 0  # the shared prefix's tokens in the prefix cache so far
    preemptions: int = 0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.lim.block_size)

    def allocate(self, r: _Req, new: int) -> bool:
        need = self.blocks_for(r.computed + new) - r.blocks
        if need > self.free_blocks:
            return False
        self.free_blocks -= max(0, need)
        r.blocks += max(0, need)
        return True

    def release(self, r: _Req) -> None:
        self.free_blocks += r.blocks
        r.blocks = 0

    def wanted(self, r: _Req) -> int:
        """The tokens ``r`` would compute this step given any budget (the long-prefill cap
        applies first, as in vLLM, so it chunks a prompt even without chunked prefill)."""
        want = r.num_tokens - r.computed
        cap = self.lim.long_prefill_token_threshold
        return min(want, cap) if cap and want > 1 else want

    def chunk(self, r: _Req, budget: int) -> int:
        return min(self.wanted(r), budget)

    def cache_hit(self, r: _Req, shared: int) -> int:
        if not self.lim.prefix_caching or r.computed:
            return 0
        usable = min(shared, self.prefix_computed, r.num_tokens - 1)
        return usable // self.lim.block_size * self.lim.block_size

    def schedule(self, shared: int) -> dict[int, int]:
        """One step's choice: request id → new tokens (vLLM's running-first, then FCFS)."""
        budget = self.lim.max_num_batched_tokens
        chosen: dict[int, int] = {}
        preempted_before = self.preemptions
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            new = self.chunk(r, budget)
            while not self.allocate(r, new):
                victim = self.running.pop()  # the last admitted goes back to waiting
                self.preempt(victim, chosen)
                if victim is r:
                    break
            else:
                chosen[id(r)] = new
                budget -= new
                i += 1
                continue
            break
        if self.preemptions > preempted_before:
            return chosen  # vLLM admits nobody in a step that had to preempt
        while self.waiting and budget > 0 and len(self.running) < self.lim.max_num_seqs:
            r = self.waiting[0]
            hit = self.cache_hit(r, shared)
            r.computed, r.cached = hit, max(r.cached, hit)
            if not self.lim.chunked_prefill and self.wanted(r) > budget:
                r.computed = 0
                break
            new = self.chunk(r, budget)
            if not self.allocate(r, new):
                r.computed = 0
                break
            self.waiting.popleft()
            self.running.append(r)
            chosen[id(r)] = new
            budget -= new
        return chosen

    def preempt(self, r: _Req, chosen: dict[int, int]) -> None:
        self.release(r)
        chosen.pop(id(r), None)
        r.computed = 0
        self.waiting.appendleft(r)
        self.preemptions += 1


def _batch(eng: _Engine, chosen: dict[int, int]) -> StepBatch:
    pre = pairs = dec = ctx = sampled = 0.0
    for r in eng.running:
        new = chosen.get(id(r), 0)
        if not new:
            continue
        if r.computed + new >= r.num_tokens:
            sampled += 1
        if new == 1 and r.computed >= r.prompt:
            dec, ctx = dec + 1, ctx + r.computed + 1
        else:
            pre, pairs = pre + new, pairs + new * (r.computed + (new + 1) / 2)
    return StepBatch(int(pre), pairs, int(dec), int(ctx), int(sampled))


def simulate(
    lim: SchedulerLimits, timer: StepTimer, work: Workload, *, request_overhead_s: float = 0.0
) -> SimResult:
    """Run ``work`` through one replica of vLLM's scheduler; ``request_overhead_s`` is added to
    each request's way in (API server, tokenizer, IPC) before the scheduler sees it."""
    if -(-(work.prompt + work.gen) // lim.block_size) > lim.kv_blocks:
        raise SimError(
            f"one request of {work.prompt + work.gen:,} tokens needs more than the KV cache's "
            f"{lim.kv_blocks:,} blocks of {lim.block_size}"
        )
    if not lim.chunked_prefill and work.prompt > lim.max_num_batched_tokens:
        # vLLM refuses this configuration at start-up (max_num_batched_tokens < max_model_len)
        raise SimError(
            f"a prompt of {work.prompt:,} tokens never fits one step of "
            f"{lim.max_num_batched_tokens:,} batched tokens without chunked prefill"
        )
    eng = _Engine(lim, lim.kv_blocks)
    # (send time, order) of requests not yet handed to the engine
    closed = work.rate is None
    first_wave = min(work.concurrency, work.total) if closed else work.total
    pending = deque(
        i / work.rate if work.rate is not None else 0.0 for i in range(first_wave)
    )
    to_send = work.total - first_wave
    done: list[RequestTiming] = []
    now, steps, most = 0.0, 0, 0

    while len(done) < work.total:
        while pending and pending[0] + request_overhead_s <= now:
            eng.waiting.append(_Req(pending.popleft(), work.prompt, work.gen, work.prompt))
        if not eng.running and not eng.waiting:
            now = pending[0] + request_overhead_s  # idle until the next request arrives
            continue
        chosen = eng.schedule(work.shared_prefix)
        if not chosen:
            raise SimError("the scheduler could not place any request (KV cache too small)")
        batch = _batch(eng, chosen)
        now += timer.step_s(batch)
        steps += 1
        most = max(most, len(eng.running))
        for r in list(eng.running):
            new = chosen.get(id(r), 0)
            r.computed += new
            eng.prefix_computed = max(eng.prefix_computed, min(r.computed, work.shared_prefix))
            if not new or r.computed < r.num_tokens:
                continue
            r.outputs += 1
            r.num_tokens += 1
            if r.outputs == 1:
                r.first = now
            if r.outputs >= r.gen:
                eng.running.remove(r)
                eng.release(r)
                done.append(RequestTiming(r.sent, r.first, now, r.gen, r.cached))
                if closed and to_send:
                    pending.append(now)
                    to_send -= 1
    return SimResult(tuple(done), steps, eng.preemptions, most,
                     max(r.finished_s for r in done) - min(r.sent_s for r in done))
