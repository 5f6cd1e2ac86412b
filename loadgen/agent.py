"""`--workload agent`: what a coding agent sends. Sessions resend a growing conversation.

Each of `--sessions` sessions runs `--turns` chat requests one after the other, `--think`
seconds apart (session i starts i/sessions of a think time late, so they do not move in lock
step). Turn 1 is a system prompt (a quarter of the first turn's tokens unless --system-tokens
says otherwise, the same for every session, as an agent's instructions are; --system-tokens 0:
none) and a user message with the session's files; each
later turn appends the previous answer and a tool result, so that the prompt grows linearly from
FIRST to LAST tokens of `--context FIRST:LAST`. The previous answer is resent as a text of
`--gen` tokens' length fixed before the run (not the model's words), so every prompt is built
and counted before the clock starts; the server's prefix cache then matches up to the previous
turn's prompt, as it would in an agent, less the answer's few tokens.

Counts: with /tokenize or --tokenizer every whole conversation is counted and the server's usage
must match; calibrated from usage, only the pieces are counted (on other text, so the sessions'
own prefixes stay out of the cache) and each conversation is an estimate, reported per request.

Per turn it reports TTFT, the new tokens (this turn's prompt less the previous turn's) and the
prefill rate of those alone (new tokens / TTFT), decode, and the prefix-cache hit rate: from
usage's cached_tokens where the server gives them, and for the whole run from the
vllm:prefix_cache_queries/hits counters of the engine's /metrics (the target's own, or
--metrics-url), read before and after.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from loadgen.config import Config
from loadgen.depth import parse_tokens
from loadgen.errors import BadArgument, ContextTooShort, PromptError
from loadgen.prompts import fit_text
from loadgen.stats import Dist, dist
from loadgen.target import Target, TargetClient, max_model_len, plan_label
from loadgen.timing import Expected, OutputCounter, RequestResult
from loadgen.tokens import Counter, Messages
from loadgen.transport import Endpoint, request_bytes
from loadgen.workload import (
    PromptInfo,
    generation_body,
    open_source,
    shuffle_words,
    strict_prompt,
)

DEFAULT_CONTEXT = (2000, 30000)
PATH = "/v1/chat/completions"


def context_for(config: Config, max_len: int | None, model: str) -> tuple[int, int]:
    """--context, or the default capped so that the last turn and its answer fit the model."""
    if config.context is not None:
        first, last = config.context
        if max_len is not None and last + config.gen > max_len:
            lower = "--soak-tokens" if config.soak_tokens is not None else "--context"
            raise ContextTooShort(
                f"model {model!r} has a context of {max_len} tokens, shorter than the last turn's"
                f" {last} + --gen {config.gen}: lower {lower} or --gen"
            )
        return first, last
    first, last = DEFAULT_CONTEXT
    if max_len is not None:
        # A margin: the pieces are fitted to the turn targets within a few tokens each.
        last = min(last, max_len - config.gen - max(64, max_len // 50))
        first = min(first, last // 2)
    if first < 64:
        raise ContextTooShort(
            f"model {model!r} has a context of {max_len} tokens, too short for an agent's"
            f" conversation with --gen {config.gen}: lower --gen or pass --context"
        )
    return first, last


def turn_targets(first: int, last: int, turns: int) -> list[int]:
    """Prompt tokens each turn aims at: linear from `first` to `last`."""
    if turns == 1:
        return [first]
    return [round(first + (last - first) * t / (turns - 1)) for t in range(turns)]


@dataclass(frozen=True)
class Pieces:
    """Fitted word lists by content length (a length is fitted once, then shuffled)."""

    words: dict[int, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentWorkload:
    target: Target
    config: Config
    conversations: tuple[tuple[Messages, ...], ...]  # [session][turn] -> messages
    prompt_tokens: tuple[tuple[int, ...], ...]  # [session][turn] -> counted (or estimated)
    info: PromptInfo
    context: tuple[int, int]
    output: OutputCounter | None = field(default=None, compare=False)
    # Unmeasured one-message chats sent before the sessions start (half the first turn's
    # length, each its own text, so nothing of them is in any session's prefix).
    warmup: tuple[Messages, ...] = ()

    def index(self, session: int, turn: int) -> int:
        return session * self.config.turns + turn

    def where(self, index: int) -> tuple[int, int]:
        return divmod(index, self.config.turns)

    def expected_for(self, index: int) -> Expected:
        s, t = self.where(index)
        strict = strict_prompt(self.info.source, self.config.strict_counts)
        return Expected(self.prompt_tokens[s][t], self.config.gen, strict_prompt=strict,
                        strict_completion=self.target.exact_length)

    def payloads(self) -> list[list[bytes]]:
        """Every request of every session, built before the clock starts."""
        return [[self._request(m) for m in turns] for turns in self.conversations]

    def warmup_payloads(self) -> list[bytes]:
        return [self._request(m) for m in self.warmup]

    def _request(self, messages: Messages) -> bytes:
        body = generation_body(self.target.model, self.config.gen, self.target.exact_length)
        body["messages"] = list(messages)
        data = json.dumps(body, separators=(",", ":")).encode()
        return request_bytes(Endpoint.parse(self.config.url), PATH, data, self.config.api_key)


class _Builder:
    """Fits the pieces of every conversation with one counter (pure apart from the counter)."""

    def __init__(self, counter: Counter, seed: int) -> None:
        self.counter = counter
        self.seed = seed
        self.cache: dict[int, tuple[str, ...]] = {}
        self.base = counter.chat([{"role": "user", "content": ""}])

    def content(self, length: int, key: str) -> str:
        """A text of `length` content tokens, distinct per `key` (a shuffle of one fit)."""
        length = max(1, length)
        if length not in self.cache:
            count = self._count
            text = fit_text(count, self.base + length, f"{self.seed}:agent:{length}")
            self.cache[length] = tuple(text.split())
        return shuffle_words((), self.cache[length], self.seed, key)

    def _count(self, text: str) -> int:
        return self.counter.chat([{"role": "user", "content": text}])

    def header(self) -> int:
        """Template tokens one more message adds besides its content (for estimates)."""
        one = self._count("a")
        two = self.counter.chat([{"role": "user", "content": "a"}] * 2)
        return max(0, two - one - 1)


def parse_system_tokens(text: str) -> int:
    """--system-tokens: a token count as --depth takes them ('2k' 2000, '2K' 2048, '500'), or
    'off' / 'none' for 0 (no system prompt); BadArgument otherwise."""
    if text.strip().lower() in ("off", "none"):
        return 0
    return parse_tokens(text)


def system_tokens(config: Config, first: int) -> int:
    """The tokens of the system prompt every session's first turn of ``first`` tokens opens with:
    --system-tokens, else a quarter of it (the planner's agent.loadgen_common_tokens mirrors
    this default); 0: none. BadArgument where it leaves no room for the session's own files."""
    if config.system_tokens is None:
        return max(1, first // 4)
    if config.system_tokens >= first:
        raise BadArgument(f"--system-tokens {config.system_tokens} is not below turn 1's {first}"
                          " tokens: lower it or raise --context FIRST")
    return config.system_tokens


def build_conversations(
    counter: Counter, config: Config, context: tuple[int, int]
) -> tuple[tuple[tuple[Messages, ...], ...], tuple[tuple[int, ...], ...]]:
    """Every session's messages per turn, and their prompt token counts (counted when the
    counter is exact, else estimated from the pieces)."""
    b = _Builder(counter, config.seed)
    first, last = context
    targets = turn_targets(first, last, config.turns)
    header = b.header()
    system_len = system_tokens(config, first)
    system = b.content(system_len - header, "system")  # the template's header is in its count
    answer_len = max(1, config.gen - header)
    growth = targets[1] - targets[0] if len(targets) > 1 else 0
    tool_len = max(1, growth - answer_len - 2 * header)
    conversations, counts = [], []
    for s in range(config.sessions):
        files_len = max(1, first - system_len - b.base)
        opening: list[dict[str, str]] = [{"role": "system", "content": system}] if system_len \
            else []
        messages: list[dict[str, str]] = [
            *opening,
            {"role": "user", "content": b.content(files_len, f"{s}:files")},
        ]
        estimate = b.base + (max(header + 1, system_len) if system_len else 0) + files_len
        turns: list[Messages] = [tuple(messages)]
        row = [estimate]
        for t in range(1, config.turns):
            answer = b.content(answer_len, f"{s}:{t}:answer")
            tool = b.content(tool_len, f"{s}:{t}:tool")
            messages = [
                *messages,
                {"role": "assistant", "content": answer},
                {"role": "user", "content": tool},
            ]
            estimate += 2 * header + answer_len + tool_len
            turns.append(tuple(messages))
            row.append(estimate)
        if counter.exact:
            row = [counter.chat(m) for m in turns]
        conversations.append(tuple(turns))
        counts.append(tuple(row))
    return tuple(conversations), tuple(counts)


def prepare_agent(config: Config) -> AgentWorkload:
    client = TargetClient(config.url, config.api_key)
    try:
        src = open_source(config, client)
        max_len = max_model_len(src.model, src.sample)
        target = Target(config.url, src.name, max_len, plan_label(client.metrics_text()),
                        exact_length=src.exact_length)
        context = context_for(config, max_len, src.name)
        conversations, counts = build_conversations(src.counter, config, context)
        longest = max(max(row) for row in counts)
        if max_len is not None and longest + config.gen > max_len:
            raise PromptError(
                f"the longest conversation counts {longest} tokens, too long for the model's"
                f" {max_len} with --gen {config.gen}: lower --context"
            )
        builder = _Builder(src.counter, config.seed)
        warmup = tuple(
            ({"role": "user", "content": builder.content(context[0] // 2, f"warmup:{i}")},)
            for i in range(config.warmup_for(config.sessions))
        )
        info = PromptInfo(
            source=src.counter.source,
            format="chat",
            calibration_requests=getattr(src.counter, "requests", 0),
            tokenizer=config.tokenizer,
        )
        return AgentWorkload(
            target, config, conversations, counts, info, context, src.output, warmup
        )
    finally:
        client.close()


# ---- the cache counters -----------------------------------------------------------------


@dataclass(frozen=True)
class CacheCounters:
    queries: float
    hits: float


def cache_counters(metrics_text: str | None) -> CacheCounters | None:
    """The prefix-cache queries/hits summed over engines, or None when absent: vLLM's own
    ``vllm:prefix_cache_*`` where the target is an engine, else the toposerve proxy's
    ``toposerve_engine_prefix_cache_*`` (the same counters, re-exported per replica)."""
    if not metrics_text:
        return None
    try:
        families = list(text_string_to_metric_families(metrics_text))
    except ValueError:
        return None
    for prefix in ("vllm:prefix_cache_", "toposerve_engine_prefix_cache_"):
        sums = {"queries": 0.0, "hits": 0.0}
        seen = False
        for family in families:
            for sample in family.samples:
                for key in sums:
                    if sample.name in (f"{prefix}{key}", f"{prefix}{key}_total"):
                        sums[key] += sample.value
                        seen = True
        if seen:
            return CacheCounters(sums["queries"], sums["hits"])
    return None


def cache_delta(before: CacheCounters | None, after: CacheCounters | None) -> dict[str, Any] | None:
    if before is None or after is None:
        return None
    queries, hits = after.queries - before.queries, after.hits - before.hits
    return {
        "queries": queries,
        "hits": hits,
        "hit_rate": hits / queries if queries > 0 else None,
    }


# ---- per-turn results (pure) ------------------------------------------------------------


@dataclass(frozen=True)
class TurnResult:
    turn: int  # 1-based
    requests_ok: int
    requests_failed: int
    prompt_tokens: Dist
    new_tokens: Dist
    ttft_s: Dist
    prefill_new_tok_s: Dist
    decode_tok_s: Dist
    cached_tokens: int | None  # sum over the turn's requests, when every one reported it
    cache_hit_rate: float | None  # cached / prompt tokens over the turn's requests


def turn_results(results: Sequence[RequestResult], workload: AgentWorkload) -> list[TurnResult]:
    by_index = {r.index: r for r in results}
    out = []
    for t in range(workload.config.turns):
        rows = [
            by_index[i]
            for s in range(workload.config.sessions)
            if (i := workload.index(s, t)) in by_index
        ]
        ok = [r for r in rows if r.ok]
        new = [_new_tokens(r, by_index, workload) for r in ok]
        cached = [r.cached_tokens for r in ok]
        prompt_sum = sum(r.prompt_tokens or 0 for r in ok)
        known = bool(ok) and all(c is not None for c in cached)
        cached_sum = sum(c or 0 for c in cached) if known else None
        out.append(
            TurnResult(
                turn=t + 1,
                requests_ok=len(ok),
                requests_failed=len(rows) - len(ok),
                prompt_tokens=dist([float(r.prompt_tokens or 0) for r in ok]),
                new_tokens=dist([float(n) for n in new]),
                ttft_s=dist([r.ttft_s for r in ok if r.ttft_s is not None]),
                prefill_new_tok_s=dist(
                    [n / r.ttft_s for n, r in zip(new, ok, strict=True) if r.ttft_s]
                ),
                decode_tok_s=dist([r.decode_tok_s for r in ok if r.decode_tok_s is not None]),
                cached_tokens=cached_sum,
                cache_hit_rate=(
                    cached_sum / prompt_sum if cached_sum is not None and prompt_sum else None
                ),
            )
        )
    return out


def _new_tokens(
    r: RequestResult, by_index: dict[int, RequestResult], workload: AgentWorkload
) -> int:
    """This turn's prompt less the previous turn's (as the server counted both)."""
    s, t = workload.where(r.index)
    now = r.prompt_tokens or workload.prompt_tokens[s][t]
    if t == 0:
        return now
    before = by_index.get(workload.index(s, t - 1))
    prev = before.prompt_tokens if before is not None and before.prompt_tokens else None
    return now - (prev if prev is not None else workload.prompt_tokens[s][t - 1])


@dataclass(frozen=True)
class AgentResult:
    sessions: int
    turns: int
    context: tuple[int, int]
    think_s: float
    per_turn: tuple[TurnResult, ...]
    prefix_cache: dict[str, Any] | None  # from the engine's counters, the whole run
    cache_source: str | None  # "usage", "metrics", both, or None
    metrics_url: str | None = None

    def turn(self, n: int) -> TurnResult:
        return self.per_turn[n - 1]
