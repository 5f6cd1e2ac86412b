"""`run(config)`: the whole benchmark as one function; the CLI only builds the Config.

Order of work: ask the target (model, context, token ids, plan), build prompts, then for each
concurrency level: warm up, drive, and only afterwards turn raw timestamps into measures.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Protocol

from loadgen.config import Config, soaked
from loadgen.depth import DepthRun, depth_config
from loadgen.errors import ContextTooShort
from loadgen.gpus import GpuMetricsPoller, has_gpu_metrics
from loadgen.outputs.results import LevelResult, Report, Warmup
from loadgen.runner import Driven, Shape, drive, drive_sessions, run_async, window
from loadgen.stats import summarize
from loadgen.target import Target, TargetClient
from loadgen.timing import Expected, OutputCounter, RawRequest, RequestResult, measure
from loadgen.transport import Client, Endpoint
from loadgen.workload import Workload, prepare


class Measurable(Protocol):
    """What measuring a level needs of a workload (the standard one or the agent's)."""

    @property
    def config(self) -> Config: ...

    @property
    def output(self) -> OutputCounter | None: ...

    def expected_for(self, index: int) -> Expected: ...


class Hooks:
    """What the shell wants to hear about while a run goes (progress bar, live metrics)."""

    def prepared(self, target: Target) -> None:
        """The target answered and prompts are built; nothing has been sent yet."""

    def level_started(
        self,
        concurrency: int | None,
        total: int | None,
        duration: float | None,
        depth: DepthRun | None = None,
    ) -> None:
        """A level begins (after its warm-up); `depth` when it measures at a --depth."""

    def tick(self, count: int, elapsed: float, finished: Sequence[RawRequest]) -> None:
        """About twice a second: requests finished so far in the level; their raw records when
        they are at hand (one process), else an empty sequence (--processes N)."""

    def level_done(self, level: LevelResult) -> None:
        """A level ended and was measured."""


def run(config: Config, hooks: Hooks | None = None) -> Report:
    hooks = hooks or Hooks()
    sampler = _gpu_poller(config)
    if sampler is None:
        return _run(config, hooks)
    with sampler:
        report = _run(config, hooks)
    return replace(report, gpus=sampler.result())


def _gpu_poller(config: Config) -> GpuMetricsPoller | None:
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
    return GpuMetricsPoller(f"{config.url.rstrip('/')}/metrics", config.gpu_sample_s, headers)


def _run(config: Config, hooks: Hooks) -> Report:
    if config.workload == "agent":
        return _run_agent(config, hooks)
    if config.depth:
        return _run_depths(config, hooks)
    workload = prepare(config)
    hooks.prepared(workload.target)
    levels = _run_levels(workload, hooks, None)
    return Report(config, workload.target, tuple(levels), time.time(), workload.prompts.info)


def _run_levels(workload: Workload, hooks: Hooks, depth: DepthRun | None) -> list[LevelResult]:
    if workload.config.processes > 1:
        return _levels_in_processes(workload, hooks, depth)
    return run_async(_levels(workload, hooks, depth))


def _run_depths(config: Config, hooks: Hooks) -> Report:
    """One run per depth (each over every concurrency level). Every depth is prepared, and
    checked against the model's context, before anything is measured."""
    workloads = [(d, _prepare_depth(config, d)) for d in config.depth]
    target = workloads[0][1].target
    hooks.prepared(target)
    levels: list[LevelResult] = []
    for tokens, workload in workloads:
        depth = DepthRun(tokens, config.prompt, config.depth_cold)
        if tokens and not config.depth_cold:
            depth = replace(depth, prime=run_async(_prime(workload)))
        levels += _run_levels(workload, hooks, depth)
    return Report(config, target, tuple(levels), time.time(), workloads[0][1].prompts.info)


def _prepare_depth(config: Config, depth: int) -> Workload:
    try:
        return prepare(depth_config(config, depth))
    except ContextTooShort as exc:
        if exc.max_len is None:
            raise ContextTooShort(f"--depth {depth} (context + --prompt): {exc}") from None
        # in the user's terms: D, --prompt and --gen as given, and the deepest that fits
        asked = depth + config.prompt + config.gen
        deepest = exc.max_len - config.prompt - config.gen
        fix = (f"the deepest that fits is --depth {deepest}; lower --depth" if deepest >= 0
               else "lower --prompt and --gen")
        raise ContextTooShort(
            f"--depth {depth} + --prompt {config.prompt} + --gen {config.gen} = {asked} tokens,"
            f" past the {exc.max_len}-token context of the served model: {fix}, or serve the"
            " model with a longer --max-model-len", exc.max_len) from None


async def _prime(workload: Workload) -> RequestResult:
    """Send the shared context once, unmeasured, so that the level finds it cached: request
    number -1 (never a measured one) with the level's prompt and one output token."""
    config = workload.config
    client = Client(Endpoint.parse(config.url), config.timeout_s)
    try:
        raw = await client.send(-1, workload.payload_fn(gen=1)(-1))
    finally:
        client.close()
    expected = replace(workload.expected, completion_tokens=1)
    return measure(raw, expected, workload.output)


async def _levels(
    workload: Workload, hooks: Hooks, depth: DepthRun | None = None
) -> list[LevelResult]:
    config = workload.config
    client = Client(Endpoint.parse(config.url), config.timeout_s)
    payload = workload.payload_fn()
    counter = itertools.count()  # request numbers never repeat, so neither do prompts
    results = []
    try:
        for concurrency in config.levels():
            warmup = None
            if n := config.warmup_for(concurrency):
                warm = Shape(concurrency or 1, requests=n)
                warmup = Warmup.of(await drive(client, payload, _take(counter, n), warm))
            level = await _level(client, payload, counter, workload, concurrency, hooks, depth)
            level = replace(level, warmup=warmup, depth=depth)
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
    depth: DepthRun | None,
) -> LevelResult:
    config = workload.config
    requests = config.requests_for(concurrency)
    shape = Shape(concurrency, config.rate, config.arrivals, requests, config.duration, config.seed)
    indices: Iterator[int] = counter
    if requests is not None:
        # Build every request before the clock starts; the loop then only writes bytes.
        built = {i: payload(i) for i in itertools.islice(counter, requests)}
        indices, payload = iter(built), built.__getitem__
    hooks.level_started(concurrency, requests, config.duration, depth)
    driven = await drive(
        client, payload, indices, shape, lambda done, elapsed: hooks.tick(len(done), elapsed, done)
    )
    return measure_level(driven, workload, concurrency, config.rate)


def _run_agent(config: Config, hooks: Hooks) -> Report:
    from loadgen.agent import (
        DEFAULT_CONTEXT,
        AgentResult,
        cache_counters,
        cache_delta,
        prepare_agent,
        turn_results,
    )

    config = soaked(config, DEFAULT_CONTEXT[0])
    workload = prepare_agent(config)
    hooks.prepared(workload.target)
    control = TargetClient(config.url, config.api_key)
    try:
        payloads = workload.payloads()
        warmup = run_async(_warm_agent(config, workload.warmup_payloads()))
        # After the warm-up: its requests are counted by the engine's cache counters too.
        before = cache_counters(control.metrics_text(config.metrics_url))
        total = config.sessions * config.turns
        hooks.level_started(config.sessions, total, None)
        driven = run_async(_drive_agent(config, payloads, workload.index, hooks))
        after = cache_counters(control.metrics_text(config.metrics_url))
    finally:
        control.close()
    level = replace(measure_level(driven, workload, config.sessions, None), warmup=warmup)
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


async def _warm_agent(config: Config, payloads: list[bytes]) -> Warmup | None:
    """The warm-up chats, as many at once as there are sessions (request numbers below 0, so
    never a session's)."""
    if not payloads:
        return None
    client = Client(Endpoint.parse(config.url), config.timeout_s)
    numbered = {-1 - i: p for i, p in enumerate(payloads)}
    try:
        shape = Shape(config.sessions, requests=len(numbered))
        driven = await drive(client, numbered.__getitem__, iter(numbered), shape)
    finally:
        client.close()
    return Warmup.of(driven)


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


def _levels_in_processes(
    workload: Workload, hooks: Hooks, depth: DepthRun | None = None
) -> list[LevelResult]:
    from loadgen.procs import drive_processes, plan_parts

    config = workload.config
    next_number = 0  # request numbers never repeat across levels, warm-up or processes
    results = []
    for concurrency in config.levels():
        requests = config.requests_for(concurrency)
        shape = Shape(
            concurrency, config.rate, config.arrivals, requests, config.duration, config.seed
        )
        warm_n = config.warmup_for(concurrency)
        warmup = range(next_number, next_number + warm_n)
        next_number += warm_n
        numbers = range(next_number, next_number + requests) if requests is not None else None
        parts = plan_parts(workload, shape, config.processes, numbers, next_number, warmup)
        hooks.level_started(concurrency, requests, config.duration, depth)
        driven, warmed = drive_processes(
            parts, lambda count, elapsed: hooks.tick(count, elapsed, ())
        )
        next_number = max((r.index for r in driven.raws), default=next_number) + 1
        level = measure_level(driven, workload, concurrency, config.rate)
        level = replace(level, warmup=Warmup.of(warmed) if warm_n else None, depth=depth)
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
