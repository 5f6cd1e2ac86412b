"""The typed results of a run, as the orchestrator (loadgen.api) hands them to the outputs."""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.agent import AgentResult
from loadgen.config import Config
from loadgen.depth import DepthRun
from loadgen.gpus import GpuBalance
from loadgen.runner import Driven, window
from loadgen.stats import Summary
from loadgen.target import Target
from loadgen.timing import RequestResult
from loadgen.workload import PromptInfo


@dataclass(frozen=True)
class Warmup:
    """The unmeasured requests sent before a level: how many, how many succeeded, how long."""

    requests: int
    ok: int
    seconds: float

    @staticmethod
    def of(driven: Driven) -> Warmup:
        span = window(driven.raws)
        ok = sum(1 for r in driven.raws if r.error is None and r.status == 200)
        return Warmup(len(driven.raws), ok, span[1] - span[0] if span else 0.0)


@dataclass(frozen=True)
class LevelResult:
    concurrency: int | None
    rate: float | None
    summary: Summary
    requests: tuple[RequestResult, ...]
    warmup: Warmup | None = None  # None: none was sent (--no-warmup)
    depth: DepthRun | None = None  # --depth: the depth this level measured at


@dataclass(frozen=True)
class Report:
    config: Config
    target: Target
    levels: tuple[LevelResult, ...]
    ended_unix: float
    prompts: PromptInfo | None = None  # how prompts were made and counted
    agent: AgentResult | None = None  # --workload agent: per-turn results, prefix cache
    gpus: GpuBalance | None = None  # the target's toposerve GPU metrics, sampled during the run
