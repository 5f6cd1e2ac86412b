"""`run(config)`: the whole benchmark as one function; the CLI only builds the Config.

Order of work: ask the target (model, context, token ids, plan), build prompts, then for each
concurrency level: warm up, drive, and only afterwards turn raw timestamps into measures.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from loadgen.config import Config
from loadgen.gpus import GpuBalance, GpuSampler, has_gpu_metrics
from loadgen.runner import Driven, Shape, drive, drive_sessions, window
from loadgen.stats import Summary, summarize
from loadgen.target import Target, TargetClient
from loadgen.timing import Expected, OutputCounter, RawRequest, RequestResult, measure
from loadgen.transport import Client, Endpoint
from loadgen.workload import PromptInfo, Workload, prepare

if TYPE_CHECKING:
    from loadgen.agent import AgentResult

T = TypeVar("T")


class Measurable(Protocol):
    """What measuring a level needs of a workload (the standard one or the agent's)."""

    @property
    def config(self) -> Config: ...

    @property
    def output(self) -> OutputCounter | None: ...

    def expected_for(self, index: int) -> Expected: ...


@dataclass(frozen=True)
class LevelResult:
    concurrency: int | None
    rate: float | None
    summary: Summary
    requests: tuple[RequestResult, ...]


@dataclass(frozen=True)
class Report:
    config: Config
    target: Target
    levels: tuple[LevelResult, ...]
    ended_unix: float
    prompts: PromptInfo | None = None  # how prompts were made and counted
    agent: AgentResult | None = None  # --workload agent: per-turn results, prefix cache
    gpus: GpuBalance | None = None  # the target's toposerve GPU metrics, sampled during the run


class Hooks:
    """What the shell wants to hear about while a run goes (progress bar, live metrics)."""

    def prepared(self, target: Target) -> None:
        """The target answered and prompts are built; nothing has been sent yet."""

    def level_started(
        self, concurrency: int | None, total: int | None, duration: float | None
    ) -> None:
        """A level begins (after its warm-up)."""

    def tick(self, count: int, elapsed: float, finished: Sequence[RawRequest]) -> None:
        """About twice a second: requests finished so far in the level; their raw records when
        they are at hand (one process), else an empty sequence (--processes N)."""

    def level_done(self, level: LevelResult) -> None:
        """A level ended and was measured."""


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when it is installed (less loop overhead per token), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)  # type: ignore[no-any-return]


def run(config: Config, hooks: Hooks | None = None) -> Report:
    hooks = hooks or Hooks()
    sampler = _gpu_sampler(config)
    if sampler is None:
        return _run(config, hooks)
    with sampler:
        report = _run(config, hooks)
    return replace(report, gpus=sampler.result())


def _gpu_sampler(config: Config) -> GpuSampler | None:
    """A sampler of the target's /metrics when it has toposerve's GPU series, else None."""
    if config.gpu_sample_s <= 0:
        return None
    client = TargetClient(config.url, config.api_key)
    try:
        present = has_gpu_metrics(client.metrics_text())
    finally:
        client.close()
    if not present:
        return None
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    return GpuSampler(f"{config.url.rstrip('/')}/metrics", config.gpu_sample_s, headers)


def _run(config: Config, hooks: Hooks) -> Report:
    if config.workload == "agent":
        return _run_agent(config, hooks)
    workload = prepare(config)
    hooks.prepared(workload.target)
    if config.processes > 1:
        levels = _levels_in_processes(workload, hooks)
    else:
        levels = run_async(_levels(workload, hooks))
    return Report(config, workload.target, tuple(levels), time.time(), workload.prompts.info)


async def _levels(workload: Workload, hooks: Hooks) -> list[LevelResult]:
    config = workload.config
    client = Client(Endpoint.parse(config.url), config.timeout_s)
    payload = workload.payload_fn()
    counter = itertools.count()  # request numbers never repeat, so neither do prompts
    results = []
    try:
        for concurrency in config.levels():
            if config.warmup:
                warm = Shape(concurrency or 1, requests=config.warmup)
                await drive(client, payload, _take(counter, config.warmup), warm)
            level = await _level(client, payload, counter, workload, concurrency, hooks)
            hooks.level_done(level)
            results.append(level)
    finally:
        client.close()
    return results


async def _level(
    client: Client,
    payload: Callable[[int], bytes],
    counter: Iterator[int],
    workload: Workload,
    concurrency: int | None,
    hooks: Hooks,
) -> LevelResult:
    config = workload.config
    requests = config.requests_for(concurrency)
    shape = Shape(concurrency, config.rate, config.arrivals, requests, config.duration, config.seed)
    indices: Iterator[int] = counter
    if requests is not None:
        # Build every request before the clock starts; the loop then only writes bytes.
        built = {i: payload(i) for i in itertools.islice(counter, requests)}
        indices, payload = iter(built), built.__getitem__
    hooks.level_started(concurrency, requests, config.duration)
    driven = await drive(
        client, payload, indices, shape, lambda done, elapsed: hooks.tick(len(done), elapsed, done)
    )
    return measure_level(driven, workload, concurrency, config.rate)


def _run_agent(config: Config, hooks: Hooks) -> Report:
    from loadgen.agent import AgentResult, cache_counters, cache_delta, prepare_agent, turn_results

    workload = prepare_agent(config)
    hooks.prepared(workload.target)
    control = TargetClient(config.url, config.api_key)
    try:
        before = cache_counters(control.metrics_text(config.metrics_url))
        payloads = workload.payloads()
        total = config.sessions * config.turns
        hooks.level_started(config.sessions, total, None)
        driven = run_async(_drive_agent(config, payloads, workload.index, hooks))
        after = cache_counters(control.metrics_text(config.metrics_url))
    finally:
        control.close()
    level = measure_level(driven, workload, config.sessions, None)
    hooks.level_done(level)
    per_turn = tuple(turn_results(level.requests, workload))
    counters = cache_delta(before, after)
    sources = [
        *(["usage"] if any(t.cache_hit_rate is not None for t in per_turn) else []),
        *(["metrics"] if counters is not None else []),
    ]
    agent = AgentResult(
        config.sessions,
        config.turns,
        workload.context,
        config.think_s,
        per_turn,
        counters,
        "+".join(sources) or None,
        config.metrics_url,
    )
    return Report(config, workload.target, (level,), time.time(), workload.info, agent)


async def _drive_agent(
    config: Config,
    payloads: list[list[bytes]],
    index: Callable[[int, int], int],
    hooks: Hooks,
) -> Driven:
    client = Client(Endpoint.parse(config.url), config.timeout_s)
    try:
        return await drive_sessions(
            client,
            payloads,
            config.think_s,
            lambda s: index(s, 0),
            lambda done, elapsed: hooks.tick(len(done), elapsed, done),
        )
    finally:
        client.close()


def _levels_in_processes(workload: Workload, hooks: Hooks) -> list[LevelResult]:
    from loadgen.procs import drive_processes, plan_parts

    config = workload.config
    next_number = 0  # request numbers never repeat across levels, warm-up or processes
    results = []
    for concurrency in config.levels():
        requests = config.requests_for(concurrency)
        shape = Shape(
            concurrency, config.rate, config.arrivals, requests, config.duration, config.seed
        )
        warmup = range(next_number, next_number + config.warmup)
        next_number += config.warmup
        numbers = range(next_number, next_number + requests) if requests is not None else None
        parts = plan_parts(workload, shape, config.processes, numbers, next_number, warmup)
        hooks.level_started(concurrency, requests, config.duration)
        driven = drive_processes(parts, lambda count, elapsed: hooks.tick(count, elapsed, ()))
        next_number = max((r.index for r in driven.raws), default=next_number) + 1
        level = measure_level(driven, workload, concurrency, config.rate)
        hooks.level_done(level)
        results.append(level)
    return results


def measure_level(
    driven: Driven, workload: Measurable, concurrency: int | None, rate: float | None
) -> LevelResult:
    """Pure: raw timestamps of one level -> its per-request results and summary."""
    results = tuple(
        measure(raw, workload.expected_for(raw.index), workload.output) for raw in driven.raws
    )
    summary = summarize(results, window(driven.raws), driven.loop, workload.config.slo())
    return LevelResult(concurrency, rate, summary, results)


def _take(counter: Iterator[int], n: int) -> Iterator[int]:
    return iter(list(itertools.islice(counter, n)))
