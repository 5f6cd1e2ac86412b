"""The CPU engine's own costs, timed on this machine through the path loadgen measures.

Below a few hundred million parameters neither a decode step nor a short prefill is arithmetic:
a decode step is the engine's host work (scheduling, preparing inputs, launching a layer's
operations, sampling) plus the OpenAI server's per token (the hop from the engine core to the API
server, detokenizing, one SSE event), and a prompt's time to first token is a request's fixed
cost (HTTP, scheduling, the first event) plus a per-token rate. All of it follows the machine
(its cores, its clock, what else runs): a constant fitted on one machine was off by 2.6x on the
same machine a day later. This timed vLLM's offline ``LLM`` before: its step came within 2% of
the served one when both were timed in the same minutes, but it timed no prefill, and it needed an
engine of its own, so a test could not time the engine it served from.

So `launcher probe --measure` starts the engine as `serve` does (vLLM's OpenAI server on the
embedded tiny model, :mod:`launcher.pipeline.enginesteps`) and :func:`time_served` times it as
loadgen does: streamed completions of token-id prompts, every body piece stamped as it arrives;
the decode step is (last token - first token) / (completion tokens - 1) of decodes sent as
loadgen's default run sends them (its 256 tokens out, greedy, back to back), the prefill a line
through the time to first token of a short and a long prompt, and attention over a cached
context: the long prompt's count of new tokens after DEPTH_CONTEXT tokens that are already in
the prefix cache (a coding agent's turn), sent right before the round's long prompt, its plain
partner; medians of ROUNDS rounds, the pairs kept one by one (:mod:`launcher.probe.attentionfit`
reads them). The planner then takes the engine's overheads from it: the measured step less what
the roofline gives the tiny model's own forward pass, the prefill's per-token rate as this CPU's
rate, and the deeper prompt's extra time as attention per (query, key) pair. Many streams: after
the rounds, BATCH_STREAMS streams sent at once (:func:`time_batch`), each a few fresh tokens
after a LONG_PROMPT-token context of its own, cached before (the one-stream step's context,
without its prefill), each stream's decode step read as loadgen reads it, the median kept where
they were in flight together (:func:`batch_step`): the step at that many sequences, from which
the planner takes each sequence's own cost in a step.

What arrives is not always when it was made: on this 2-core machine under load (~3.6) vLLM's
server held a stream's token events back and sent the whole generation at once, each event in its
own write, one token each (``return_token_ids`` said so), 33 events within 0.3 ms, some 200 ms
after the first token was made; the client at nice -15 saw the same, so it is the server's doing
(its engine core makes a step's output while its output thread waits for the interpreter), not a
client read late. (last - first) / (tokens - 1) then read a step of 0.01 ms, and the prefill line
through that late first token 421 us a token against 53 in the round after it. What cannot be
held back is read instead: a one-token request's first token (nothing after it to wait for) and
a stream's end (what was held is sent once the generation is made). So every first token timed
is a one-token request's (the long prompt's too, the same length as the decode's), and a stream
whose first token arrived in one burst with later ones (closer than BURST_GAP_S), or whose step
reads below it (:meth:`Streamed.unread`), has its step read from its end less that one-token
request's first token (:meth:`Streamed.end_step_s`). Each such round is said in the record
(``unread_rounds``) and on `probe --measure`'s line; a round whose step cannot be read that way
either is not kept and run again, up to as many rounds more; none kept is a one-line
:class:`EngineStepError`, never a step of 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import random
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from launcher.probe import keptrecord
from launcher.probe.attentionfit import DepthPair
from launcher.probe.keptrecord import number_field, text_field, write_cache_json
from topocommon import jsontext

FORMAT = 7  # 1 was the offline engine's step, without the server's per-token work
# 2: without the timing at depth; 3: with it as one median difference, no pairs to judge its
# spread by. Both still read, their attention untimed (the plan says so). 4: without the timed
# model's layer and LM-head weights apart: still read, its prefill rate not used (the plan says
# so), since a rate per prompt token is one over the layers' weights alone. 5: without the step
# at many streams: still read, its per-sequence cost assumed (the plan says so). 6: without the
# rounds not kept; its steps may have been read from tokens the server held back (a step below
# BURST_GAP_S is refused on reading, as any record's is)
READ_FORMATS = (2, 3, 4, 5, 6, FORMAT)
# Tokens per timed decode, and rounds. A decode is timed as loadgen's default run reads one: its
# --gen (256 tokens out, so STEPS = 255 gaps, over loadgen's own 512-768 tokens of context), and
# its requests as loadgen sends them, greedy and one decode right after another (time_served).
# Timed as before instead, each 129-token decode after its round's one-token requests and
# sampled at the server's default temperature, the step read 0.75-1.09 of loadgen's decode
# (median 0.95) in 9 rounds interleaved with this timing and loadgen's on one engine, quiet,
# beside one busy loop and beside a 1-in-3 busy one; this timing 0.97-1.15 (median 1.02): under
# the busy loop 0.75-0.79 against 1.01-1.02, its held-back decodes read from their ends over 128
# steps less a first token timed alone (2026-12-05, docs/planner.md 7c).
STEPS = 255
ROUNDS = 7
# The step at many streams keeps its shorter generation (time_served: at most this many steps):
# 16 streams of 256 tokens would double that timing for no figure a plan at 8 streams missed.
BATCH_STEPS = 128
# The two prompts the prefill line goes through: a request's fixed cost, and loadgen's default
# prompt, whose request then times the decode steps at loadgen's default context (a 1024-token
# prompt's steps were 15% slower here than loadgen's at 512).
SHORT_PROMPT = 16
LONG_PROMPT = 512
# The cached context the depth timing puts before LONG_PROMPT new tokens: a few thousand tokens,
# as an agent's turns reach early on, and whole blocks of the CPU engine's 128 tokens, so that
# all of it is cached and the deeper request computes only the new tokens. Sent once, unmeasured,
# before the rounds (its own prefill is ~3 s on two cores); each round then adds ~1 s: the new
# tokens' prefill (~0.7 s) and their attention over the context (~0.3 s at ~300 ns a pair). Its
# plain partner is the round's long prompt, sent right after it: no request more.
DEPTH_CONTEXT = 2048
# The step at many sequences: this many streams sent at once, each SHORT_PROMPT fresh tokens
# after a LONG_PROMPT-token context of its own cached once before (so each decodes at the
# one-stream step's context, and their prefill is one short step), BATCH_STEPS + 1 tokens out;
# BATCH_ROUNDS times, the median kept. Contexts of their own, as loadgen's streams and users'
# have: streams over one shared cached context read their attention from the same blocks, and
# stepped 3.05-3.61 ms at 8 streams against 3.68-4.57 over contexts of their own (each of three
# rounds 18-27% faster), 3.97-5.08 against 4.29-5.95 at 16 (4-25%), on this project's 2-core
# machine (2026-12-05; loadgen's 8-stream run there: the engine's own step 3.55-3.72 ms).
# 16: between the 8 and 32 streams a plan is asked for, and a second or so a round on two cores
# (all 16 decode in a step of ~8 ms here).
BATCH_STREAMS = 16
BATCH_ROUNDS = 3
# A round's streams must have been in flight together for at least this share of their decode:
# first tokens further apart (one handed over late, or read late by a starved client: one
# stream's first token 0.8 s after the others' here) time something else, and the round is not
# kept.
MIN_TOGETHER = 0.5
# Token events closer together than this arrived in one burst, not one decode step apart: events
# the server wrote back to back after holding them came ~10 us apart here (33 in 0.3 ms), while
# the CPU engine's quickest step (the first after a prefill) was 2.3 ms apart on a quiet machine
# and a served step of vLLM on a GPU is not below a millisecond. Not fitted: a bound between the
# two, 50x the one and 4x below the other. It is also the least step a record may hold.
BURST_GAP_S = 0.5e-3
REQUEST_TIMEOUT_S = 120.0


class EngineStepError(ValueError):
    """A step measurement that failed or a saved one that cannot be read (one line)."""


@dataclass(frozen=True)
class StepKey:
    device: str  # "cpu: AMD EPYC 7B13 (2 threads)", "NVIDIA H200"
    vllm: str
    torch: str

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class EngineStep:
    key: StepKey
    step_s: float  # median decode step of the measured model, one stream
    steps_s: tuple[float, ...]  # every round's step, for the spread
    # the measured model's size, so the planner can take its own forward pass out of the step
    model_params: int
    model_weight_bytes: int
    measured_at: str
    # time to first token = prefill_fixed_s + prompt tokens x prefill_token_s (medians); None
    # in a record made without them (the planner then assumes its prefill)
    prefill_fixed_s: float | None = None
    prefill_token_s: float | None = None
    # attention over a cached context (format 4): per round, ``depth_new_tokens`` new tokens
    # after the ``depth_tokens`` context and the same count alone, with the cached tokens the
    # server's usage counted (attentionfit reads them); None/(): not timed (an older record, or
    # a server that does not report cached tokens)
    depth_tokens: int | None = None
    depth_new_tokens: int | None = None
    depth_pairs: tuple[DepthPair, ...] = ()
    # the timed model's attention FLOPs per (query, key) pair, for the reading's plausibility
    # against its prefill per-token rate (costmodel.attention_work); None: not checkable
    model_pair_flops: float | None = None
    # (format 5) the timed model's weights a prompt token's matmuls pass (ModelSpec.token_params)
    # and its LM head's (lm_head_params, run once per sampled position): the prefill's time per
    # prompt token is the layers' alone. None: an older record, whose prefill rate is not used
    model_token_params: int | None = None
    model_head_params: int | None = None
    # (format 6) the decode step with ``batch_streams`` sequences in flight, every kept round's
    # (time_batch, batch_step); None/(): not timed (an older record, or no round kept)
    batch_streams: int | None = None
    batch_steps_s: tuple[float, ...] = ()
    # (format 7) each round whose streams could not be read as they came, why (Streamed.unread,
    # batch_why: tokens the server held back and sent in one burst, many streams not in flight
    # together) and what was done (its step read from the stream's end, or the round not kept)
    unread_rounds: tuple[str, ...] = ()

    @property
    def batch_step_s(self) -> float | None:
        """The median step at ``batch_streams`` sequences (None: not timed)."""
        return statistics.median(self.batch_steps_s) if self.batch_steps_s else None

    @property
    def depth_cached_tokens(self) -> int | None:
        """The most of the context any round found cached (None: not timed)."""
        return max((p.cached for p in self.depth_pairs), default=None)

    @property
    def spread(self) -> float:
        """Slowest round over fastest: how steady the machine was while it was measured."""
        return max(self.steps_s) / min(self.steps_s) if self.steps_s else 1.0


# ------------------------------------------------------------------------------------- JSON
def to_json(rec: EngineStep) -> dict[str, Any]:
    return {"version": FORMAT, **asdict(rec)}


def _num(raw: Any, what: str, hi: float) -> float:
    return number_field(raw, what, hi, EngineStepError)


def _text(raw: Any, what: str) -> str:
    return text_field(raw, what, EngineStepError)


def from_json(raw: Any) -> EngineStep:
    """A saved measurement; :class:`EngineStepError` (one line) for anything unreadable."""
    if not isinstance(raw, dict):
        raise EngineStepError("an engine step record is not a JSON object")
    version = raw.get("version")
    if isinstance(version, bool) or version not in READ_FORMATS:
        # (the reason line keptrecord makes of it says how to time again)
        raise EngineStepError(f"engine step record version {str(version)[:20]!r} is not one of "
                              f"{', '.join(map(str, READ_FORMATS))}")
    k = raw.get("key")
    if not isinstance(k, dict):
        raise EngineStepError("the engine step record has no key object")
    key = StepKey(*(_text(k.get(f), f) for f in ("device", "vllm", "torch")))
    steps = raw.get("steps_s")
    if not isinstance(steps, list) or not steps or len(steps) > 1000:
        raise EngineStepError("steps_s is not a non-empty list")
    fixed, per_token = raw.get("prefill_fixed_s"), raw.get("prefill_token_s")
    depth = _depth(raw) if version >= 4 else (None, None, (), None)
    split = (int(_num(raw.get("model_token_params"), "model_token_params", 1e13)),
             int(_num(raw.get("model_head_params"), "model_head_params", 1e13))
             ) if version >= 5 else (None, None)
    streams, batch_steps = _batch(raw) if version >= 6 else (None, ())
    unread_rounds = _unread_rounds(raw.get("unread_rounds")) if version >= 7 else ()
    rec = EngineStep(
        key,
        _num(raw.get("step_s"), "step_s", 60.0),
        tuple(_num(s, "a round's step", 60.0) for s in steps),
        int(_num(raw.get("model_params"), "model_params", 1e13)),
        int(_num(raw.get("model_weight_bytes"), "model_weight_bytes", 1e14)),
        _text(raw.get("measured_at"), "measured_at"),
        None if fixed is None else _num(fixed, "prefill_fixed_s", 60.0),
        None if per_token is None else _num(per_token, "prefill_token_s", 1.0),
        *depth,
        *split,
    )
    # a step no decode makes: read from events that came in one burst (a format 6 record could
    # hold one); refused, so the plan does not build on it
    least = min(rec.step_s, *rec.steps_s, *batch_steps)
    if least < BURST_GAP_S:
        raise EngineStepError(f"a decode step of {least * 1e3:.3f} ms in the record is below "
                              f"{BURST_GAP_S * 1e3:g} ms, no decode step: its tokens were read "
                              "as they came in a burst")
    # by name: the starred parts above are of no fixed length to a type checker
    return replace(rec, batch_streams=streams, batch_steps_s=batch_steps,
                   unread_rounds=unread_rounds)


def _unread_rounds(raw: Any) -> tuple[str, ...]:
    """The rounds not read as they came: a list of one-line texts (none: every one was)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > 1000:
        raise EngineStepError("unread_rounds is not a list of reasons")
    return tuple(_text(r, "an unread round's reason") for r in raw)


def _batch(raw: dict[str, Any]) -> tuple[int | None, tuple[float, ...]]:
    """The step at many streams: their count and every kept round's step, or neither."""
    streams, steps = raw.get("batch_streams"), raw.get("batch_steps_s")
    if streams is None and steps in (None, []):
        return None, ()
    if streams is None or steps is None:
        raise EngineStepError("the timing at many streams is incomplete: "
                              + ("batch_streams" if streams is None else "batch_steps_s")
                              + " missing")
    count = _count(streams, "batch_streams")
    if count < 2:
        raise EngineStepError(f"batch_streams {count} is not many streams")
    if not isinstance(steps, list) or not steps or len(steps) > 1000:
        raise EngineStepError("batch_steps_s is not a non-empty list")
    return count, tuple(_num(s, "a round's step at many streams", 60.0) for s in steps)


def _count(raw: Any, what: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= 10**8:
        raise EngineStepError(f"{what} is not a token count: {str(raw)[:40]!r}")
    return raw


def _depth(raw: dict[str, Any]
           ) -> tuple[int | None, int | None, tuple[DepthPair, ...], float | None]:
    """The timing at depth: context, new tokens and pairs all given, or none (not timed)."""
    names = ("depth_tokens", "depth_new_tokens", "depth_pairs")
    given = [raw.get(n) for n in names]
    flops = raw.get("model_pair_flops")
    flops_kept = None if flops is None else _num(flops, "model_pair_flops", 1e15)
    if all(v is None or v == [] for v in given):
        return None, None, (), flops_kept
    if any(v is None for v in given):
        raise EngineStepError("the timing at depth is incomplete: "
                              + ", ".join(n for n, v in zip(names, given, strict=True)
                                          if v is None) + " missing")
    depth, new = _count(given[0], names[0]), _count(given[1], names[1])
    pairs = given[2]
    if not isinstance(pairs, list) or not pairs or len(pairs) > 1000:
        raise EngineStepError("depth_pairs is not a non-empty list")
    return depth, new, tuple(_pair(p, depth) for p in pairs), flops_kept


def _pair(raw: Any, depth: int) -> DepthPair:
    if not isinstance(raw, dict):
        raise EngineStepError("a depth pair is not a JSON object")
    cached = _count(raw.get("cached"), "a depth pair's cached tokens")
    if cached > depth:
        raise EngineStepError(f"a depth pair's cached tokens {cached} are more than the "
                              f"context {depth}")
    return DepthPair(_num(raw.get("plain_s"), "a depth pair's plain_s", 600.0),
                     _num(raw.get("deep_s"), "a depth pair's deep_s", 600.0), cached)


def cache_path(cache_dir: Path, key: StepKey) -> Path:
    return cache_dir / "engine-step" / f"{key.digest()}.json"


def save(cache_dir: Path, rec: EngineStep) -> Path | None:
    """Keep the measurement where a later plan finds it; None when the cache is not writable."""
    return write_cache_json(cache_path(cache_dir, rec.key), to_json(rec))


KEPT = keptrecord.Kind(
    "the CPU engine's step `probe --measure` kept", "planned with the engine's overheads assumed",
    from_json, lambda rec: rec.key, again="`launcher probe --measure` times the engine again")


def read(cache_dir: Path, key: StepKey) -> tuple[EngineStep | None, str]:
    """The kept measurement for ``key``, or the one-line reason a kept file cannot be used
    (:func:`keptrecord.read`); (None, "") where none is."""
    return keptrecord.read(KEPT, cache_path(cache_dir, key), key)


def load(cache_dir: Path, key: StepKey) -> EngineStep | None:
    """The kept measurement for ``key``; None when there is none or it cannot be used."""
    return read(cache_dir, key)[0]




# ---------------------------------------------------------------------------------- timing
@dataclass(frozen=True)
class Served:
    """An engine that serves the embedded model: its root URL, served name and key headers."""

    url: str
    model: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Streamed:
    """One streamed completion as loadgen reads it: when it was sent, when each event that
    carried tokens arrived, and the completion tokens the server's usage reports."""

    sent: float
    token_times: tuple[float, ...]
    completion_tokens: int | None
    # usage.prompt_tokens_details.cached_tokens: the prompt's tokens found in the prefix cache
    # (None: the server does not say; vLLM with --enable-prompt-tokens-details does)
    cached_tokens: int | None = None

    @property
    def ttft_s(self) -> float:
        return self.token_times[0] - self.sent

    @property
    def tokens(self) -> int:
        """The completion tokens: the server's usage, else one a token event."""
        return self.completion_tokens or len(self.token_times)

    @property
    def held(self) -> int:
        """The token events that arrived in one burst with the first: each less than
        BURST_GAP_S after the one before (0: the first token came alone)."""
        held = 0
        for before, after in itertools.pairwise(self.token_times):
            if after - before >= BURST_GAP_S:
                break
            held += 1
        return held

    def unread(self) -> str | None:
        """Why neither this stream's first token nor its decode step can be read (None: both
        can). A first token that came in one burst with later ones was held back (by the server
        before it wrote them, or by a client that read them late) until those were made: its
        time is theirs, and the decode from it is short by as many steps, to none when the whole
        generation came at once. A step below BURST_GAP_S is no decode step either (a first
        token that came alone, the rest in a burst after it)."""
        n = self.tokens
        if n < 2 or len(self.token_times) < 2:
            return f"its {n} token(s) came in {len(self.token_times)} event(s): no step to read"
        if self.held:
            return (f"its first token came in one burst with {self.held} more of its {n} tokens "
                    f"(within {(self.token_times[self.held] - self.token_times[0]) * 1e3:.2f} ms:"
                    " held back, then sent at once)")
        step = self.step_s
        if step is None or step < BURST_GAP_S:
            span = self.token_times[-1] - self.token_times[0]
            return (f"its {n} tokens came within {span * 1e3:.2f} ms, a step no decode makes "
                    "(held back, then sent at once)")
        return None

    @property
    def step_s(self) -> float | None:
        """loadgen's decode, as a step: (last token - first token) / (completion tokens - 1);
        None where the stream has no two tokens. Read it where :meth:`unread` is None."""
        if self.tokens < 2 or not self.token_times:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (self.tokens - 1)

    def end_step_s(self, first_token_s: float) -> float | None:
        """The decode step from what a server that holds tokens back cannot move: the stream's
        end (what it held is sent when the generation is made) less ``first_token_s``, the time
        to first token of a one-token request of the same prompt length, over the tokens after
        the first. None where that is below BURST_GAP_S: no decode step either."""
        if self.tokens < 2 or not self.token_times:
            return None
        step = (self.token_times[-1] - self.sent - first_token_s) / (self.tokens - 1)
        return step if step >= BURST_GAP_S else None


def read_stream(sent: float, pieces: Iterable[tuple[float, bytes]]) -> Streamed:
    """The token events of an SSE body given as (arrival time, bytes) pieces; an event is
    stamped with the piece that completed it. Events that are not JSON are skipped."""
    times: list[float] = []
    tokens: int | None = None
    cached: int | None = None
    buffer = b""
    for t, piece in pieces:
        buffer += piece
        *events, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                try:
                    body = jsontext.loads(line[5:])
                except ValueError:
                    continue
                if not isinstance(body, dict):
                    continue
                if isinstance(body.get("choices"), list) and body["choices"]:
                    times.append(t)
                usage = body.get("usage")
                if not isinstance(usage, dict):
                    continue
                if isinstance(usage.get("completion_tokens"), int):
                    tokens = usage["completion_tokens"]
                details = usage.get("prompt_tokens_details")
                if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                    cached = details["cached_tokens"]
    return Streamed(sent, tuple(times), tokens, cached)


def batch_step(streams: Sequence[Streamed]) -> float | None:
    """The decode step with ``streams`` in flight together: the median of their decode steps as
    loadgen reads them (first to last token over the tokens between: events that merge under
    load, or arrive in a burst after the client was held up mid-stream, move neither end; a
    window between the streams' ends, counted by running token counts, lost 3 of 6 rounds
    here to such a 0.5 s hold-up), of those whose step can be read (:meth:`Streamed.unread`).
    None where :func:`batch_why` says why not."""
    if batch_why(streams) is not None:
        return None
    return statistics.median(s.step_s or 0.0 for s in streams if s.unread() is None)


def batch_why(streams: Sequence[Streamed]) -> str | None:
    """Why ``streams`` give no step at many (None: they do): fewer than two, fewer than half
    whose first token and step can be read (:meth:`Streamed.unread`: the others held back and
    sent in a burst), or the readable ones' first tokens further apart than (1 - MIN_TOGETHER)
    of their median decode: they were not in flight together for most of it."""
    if len(streams) < 2:
        return f"{len(streams)} stream(s) is not many"
    whys = [(s, s.unread()) for s in streams]  # each stream's events walked once
    held = [why for _, why in whys if why is not None]
    read = [s for s, why in whys if why is None]
    if len(read) < max(2, len(streams) / 2):
        return f"{len(held)} of {len(streams)} streams unread, one as {held[0]}"
    streams = read
    firsts = [s.token_times[0] for s in streams]
    span = statistics.median(s.token_times[-1] - s.token_times[0] for s in streams)
    if max(firsts) - min(firsts) > (1 - MIN_TOGETHER) * span:
        return (f"their first tokens came {(max(firsts) - min(firsts)) * 1e3:.0f} ms apart over "
                f"a {span * 1e3:.0f} ms decode: not in flight together for "
                f"{MIN_TOGETHER:.0%} of it")
    return None


def prefill_line(short_s: float, long_s: float, short: int = SHORT_PROMPT,
                 long: int = LONG_PROMPT) -> tuple[float, float]:
    """(fixed, per token): the line through the time to first token of two prompt lengths. A
    long prompt no slower than the short one (noise) is a fixed cost with no per-token part."""
    per_token = max(1e-9, (long_s - short_s) / (long - short))
    return max(1e-6, short_s - short * per_token), per_token


def _body(served: Served, ids: list[int], gen: int) -> dict[str, Any]:
    """A streamed completion of exactly ``gen`` tokens, its usage at the end: the fields
    loadgen's requests carry (loadgen.workload.generation_body), greedy as its are."""
    return {"model": served.model, "prompt": ids, "max_tokens": gen, "min_tokens": gen,
            "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}


def _checked(got: Streamed, gen: int) -> Streamed:
    if got.completion_tokens != gen or not got.token_times:
        raise EngineStepError(f"a timed request got {got.completion_tokens} tokens, not {gen} "
                              "(the engine did not honour min_tokens/ignore_eos)")
    return got


def _refused(status: int, text: str) -> EngineStepError:
    return EngineStepError(f"the engine answered HTTP {status} to a timed request: "
                           f"{text[:200]!r}")


def _stream(client: httpx.Client, served: Served, ids: list[int], gen: int) -> Streamed:
    body = _body(served, ids, gen)
    pieces: list[tuple[float, bytes]] = []
    sent = time.perf_counter()
    with client.stream("POST", f"{served.url}/v1/completions", json=body,
                       headers=dict(served.headers)) as resp:
        if resp.status_code != 200:
            resp.read()
            raise _refused(resp.status_code, resp.text)
        for piece in resp.iter_raw():
            pieces.append((time.perf_counter(), piece))
    return _checked(read_stream(sent, pieces), gen)


async def _astream(client: httpx.AsyncClient, served: Served, ids: list[int],
                   gen: int) -> Streamed:
    pieces: list[tuple[float, bytes]] = []
    sent = time.perf_counter()
    async with client.stream("POST", f"{served.url}/v1/completions",
                             json=_body(served, ids, gen),
                             headers=dict(served.headers)) as resp:
        if resp.status_code != 200:
            await resp.aread()
            raise _refused(resp.status_code, resp.text)
        async for piece in resp.aiter_raw():
            pieces.append((time.perf_counter(), piece))
    return _checked(read_stream(sent, pieces), gen)


def time_batch(served: Served, prompts: Sequence[list[int]], gen: int) -> tuple[Streamed, ...]:
    """``prompts`` sent at once, ``gen`` tokens each: from one event loop, so that they leave
    together (threads of a client on two busy cores left up to 3 s apart)."""
    async def all_at_once() -> list[Streamed]:
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=httpx.Limits(
                max_connections=len(prompts) + 1)) as client:
            return await asyncio.gather(*(_astream(client, served, p, gen) for p in prompts))
    return tuple(asyncio.run(all_at_once()))


@dataclass(frozen=True)
class Timed:
    steps_s: tuple[float, ...]  # each round's decode step
    short_ttft_s: tuple[float, ...]  # each round's time to first token, SHORT_PROMPT tokens
    long_ttft_s: tuple[float, ...]  # and LONG_PROMPT tokens
    # each round's LONG_PROMPT new tokens after the cached context of ``depth_tokens`` with
    # the round's long prompt as its plain partner (empty: not timed)
    depth_pairs: tuple[DepthPair, ...] = ()
    depth_tokens: int = 0
    # each kept round's decode step with ``batch_streams`` streams in flight (empty: not timed)
    batch_steps_s: tuple[float, ...] = ()
    batch_streams: int = 0
    # each round not read as it came: why, and what was done (one line each, at most 200
    # characters)
    unread_rounds: tuple[str, ...] = ()


def time_served(served: Served, vocab: int, *, rounds: int = ROUNDS, steps: int = STEPS,
                seed: int | None = None, depth: int = DEPTH_CONTEXT,
                batch: int = BATCH_STREAMS) -> Timed:
    """Time a running engine as loadgen does, one stream at a time: per round a short prompt
    (time to first token, its only token) and a long one (its time to first token, its only
    token), and as many new tokens after a cached context of ``depth`` tokens (0: not timed)
    sent right before the long one, its plain partner: the two first tokens are then
    milliseconds apart, so a machine whose speed moves between rounds moves both
    (attentionfit). The context is sent once before the rounds and the same in every round.
    Then ``rounds`` long prompts that each generate ``steps`` + 1 tokens (the decode step), one
    right after another, greedy, as loadgen's default run sends its requests (STEPS). Then,
    ``batch`` (0: not timed) streams at once, BATCH_ROUNDS times, each a fresh SHORT_PROMPT
    after a LONG_PROMPT context of its own sent once before them, at most BATCH_STEPS + 1 tokens
    out: the step with that many in flight (batch_step; a round it cannot read is not kept). A
    decode stream that cannot be read as it came (:meth:`Streamed.unread`: its tokens held back
    and sent in a burst) has its step read from its end (:meth:`Streamed.end_step_s`, less the
    long prompts' median first token), said; a decode whose step cannot be read either way is
    not kept, said, and sent again: up to ``rounds`` (and BATCH_ROUNDS) more, until ``rounds``
    are kept. Every other prompt is new token ids, so that nothing else comes from the prefix
    cache: drawn from a fresh seed on every call unless ``seed`` is given (a second timing of
    one engine with the first one's prompts met them cached: a 512-token first token 3.6x
    faster than loadgen's).
    :class:`EngineStepError` (one line) when the engine fails a request, or no round's streams
    could be read."""
    rng = random.Random(seed)  # None: seeded from the OS, as loadgen draws a seed per run

    def ids(n: int) -> list[int]:  # above the few special ids a vocabulary starts with
        return [rng.randrange(min(5, vocab - 1), vocab) for _ in range(n)]

    short: list[float] = []
    long_: list[float] = []
    step: list[float] = []
    many: list[float] = []
    pairs: list[DepthPair] = []
    unread_rounds: list[str] = []
    context = ids(depth)
    try:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            for _ in range(2):  # a fresh engine's first requests are slow
                _stream(client, served, ids(LONG_PROMPT), 8)
            if depth:  # into the prefix cache, where an agent's previous turn left it
                _stream(client, served, context, 1)
            for _ in range(rounds):
                # first tokens of one-token requests: a server that holds a stream's tokens back
                # until its generation is made then sends each on time (a stream's first of
                # two came a step late here, of 33 a whole decode late)
                first = _stream(client, served, ids(SHORT_PROMPT), 1)
                at = _stream(client, served, context + ids(LONG_PROMPT), 1) if depth else None
                plain = _stream(client, served, ids(LONG_PROMPT), 1)
                short.append(first.ttft_s)
                long_.append(plain.ttft_s)
                if at is not None and at.cached_tokens is not None:
                    pairs.append(DepthPair(plain.ttft_s, at.ttft_s, at.cached_tokens))
            # then the decodes, one right after another as loadgen sends its requests (STEPS);
            # one whose step cannot be read is sent again, up to ``rounds`` more
            plain_s = statistics.median(long_)
            for run in range(1, 2 * rounds + 1):
                if len(step) == rounds:
                    break
                got = _stream(client, served, ids(LONG_PROMPT), steps + 1)
                read, why = got.step_s, got.unread()
                if why is not None:
                    read = got.end_step_s(plain_s)
                    done = ("step read from its end" if read is not None else
                            "step not read, not from its end either: not kept")
                    unread_rounds.append(f"round {run}: the decode's {done}: {why}"[:200])
                if read is not None:
                    step.append(read)
            if not step:
                raise EngineStepError(f"no timed round could be read, {len(unread_rounds)} run: "
                                      f"{unread_rounds[-1][:200]} (a machine this loaded holds "
                                      "the engine's tokens back: time it when it is quieter)")
            if batch > 1:
                contexts = [ids(LONG_PROMPT) for _ in range(batch)]
                for c in contexts:  # each into the prefix cache
                    _stream(client, served, c, 1)
                # a first batch of a size is slow: one warm round, unread, first
                for run in range(2 * BATCH_ROUNDS + 1):
                    if len(many) == BATCH_ROUNDS:
                        break
                    streams = time_batch(served, [c + ids(SHORT_PROMPT) for c in contexts],
                                         9 if not run else min(steps, BATCH_STEPS) + 1)
                    if not run:
                        continue
                    step_at = batch_step(streams)
                    if step_at is None:
                        unread_rounds.append(f"round {run} at {batch} streams, not kept: "
                                             f"{batch_why(streams)}"[:200])
                    else:
                        many.append(step_at)
    except httpx.HTTPError as exc:
        raise EngineStepError(f"a timed request to {served.url} failed: "
                              f"{type(exc).__name__}: {str(exc)[:200]}") from None
    # a server that does not count cached tokens leaves attention untimed, never guessed
    timed_depth = len(pairs) == len(long_)
    return Timed(tuple(step), tuple(short), tuple(long_), tuple(pairs) if timed_depth else (),
                 depth if timed_depth else 0, tuple(many), batch if many else 0,
                 tuple(unread_rounds))


def record(key: StepKey, timed: Timed, *, params: int, weight_bytes: int, token_params: int,
           head_params: int, pair_flops: float | None = None,
           now: str | None = None) -> EngineStep:
    """The kept measurement: medians of the rounds, and at depth every round's pair (what
    they say is attentionfit's to read); ``pair_flops``: the timed model's attention FLOPs a
    (query, key) pair; ``token_params``/``head_params``: its layers' and LM head's weights;
    the reasons rounds were not kept go with it."""
    if not timed.steps_s:
        raise EngineStepError("no timed round was kept: nothing to record")
    fixed, per_token = prefill_line(statistics.median(timed.short_ttft_s),
                                    statistics.median(timed.long_ttft_s))
    timed_depth = bool(timed.depth_pairs)
    return EngineStep(key, statistics.median(timed.steps_s), timed.steps_s, params, weight_bytes,
                      now or time.strftime("%Y-%m-%dT%H:%M:%S"), fixed, per_token,
                      timed.depth_tokens if timed_depth else None,
                      LONG_PROMPT if timed_depth else None, timed.depth_pairs, pair_flops,
                      token_params, head_params,
                      timed.batch_streams if timed.batch_steps_s else None, timed.batch_steps_s,
                      timed.unread_rounds)
