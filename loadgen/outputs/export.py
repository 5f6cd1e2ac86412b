"""loadgen_* metrics for Prometheus: pushed to a Pushgateway and/or served while the run lasts.

Names and labels are the team's agreed ones (metrics.md). Every series carries run_id, model,
prompt, gen, concurrency and plan, plus any --label; a sweep fills one series per concurrency
and pushes the whole registry each time, so the Pushgateway group (job="loadgen", run_id) ends
up holding every level.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Gauge, push_to_gateway, start_http_server

from loadgen.agent import AgentResult
from loadgen.config import Config
from loadgen.depth import DepthRun, summarize_depth
from loadgen.errors import ExportError
from loadgen.outputs.results import LevelResult, Report
from loadgen.stats import STATS, Dist
from loadgen.target import Target

# depth / depth_mode: --depth's context tokens and "cached"/"cold"; empty (no label in
# Prometheus) for a run without --depth.
BASE_LABELS = ("run_id", "model", "prompt", "gen", "concurrency", "plan", "depth", "depth_mode")
_DISTS = {
    "ttft_s": ("loadgen_ttft_seconds", "Time to first token per request (client side)"),
    "itl_s": ("loadgen_itl_seconds", "Gaps between streamed tokens"),
    "e2e_s": ("loadgen_e2e_seconds", "Request end to end latency"),
    "prefill_tok_s": ("loadgen_prefill_tokens_per_second", "Prompt tokens / TTFT per request"),
    "decode_tok_s": (
        "loadgen_decode_tokens_per_second",
        "(completion tokens - 1) / (last token - first token) per request",
    ),
}


_TURN_DISTS = {
    "ttft_s": ("loadgen_agent_ttft_seconds", "TTFT of one agent turn"),
    "prefill_new_tok_s": (
        "loadgen_agent_prefill_new_tokens_per_second",
        "New prompt tokens of the turn (this prompt less the previous) / TTFT",
    ),
    "new_tokens": ("loadgen_agent_new_tokens", "Prompt tokens one agent turn added"),
    "prompt_tokens": ("loadgen_agent_prompt_tokens", "Prompt tokens of one agent turn (its depth)"),
    "decode_tok_s": ("loadgen_agent_decode_tokens_per_second", "Decode rate of one agent turn"),
}


_DEPTH_DISTS = {
    "cached_tokens": (
        "loadgen_depth_cached_tokens",
        "Prompt tokens the server served from its cache, per request (usage.cached_tokens)",
    ),
    "prefill_new_tok_s": (
        "loadgen_depth_prefill_new_tokens_per_second",
        "The new tokens after the depth's context / TTFT, per request",
    ),
}


class Metrics:
    def __init__(self, config: Config, target: Target) -> None:
        self.registry = CollectorRegistry()
        extra = dict(config.labels)
        self._const = {
            "run_id": config.run_id,
            "model": target.model,
            "prompt": str(config.prompt),
            "gen": str(config.gen),
            "plan": extra.pop("plan", target.plan),
            **extra,
        }
        names = [*BASE_LABELS, *extra]
        reg = self.registry
        self._dists = _stat_gauges(_DISTS, names, reg)
        self._output = Gauge(
            "loadgen_output_tokens_per_second",
            "Generated tokens per second over the run (all streams)",
            names,
            registry=reg,
        )
        self._total = Gauge(
            "loadgen_total_tokens_per_second",
            "Prompt + generated tokens per second over the run",
            names,
            registry=reg,
        )
        self._requests = Gauge(
            "loadgen_requests_total",
            "Requests of the run by outcome",
            [*names, "outcome"],
            registry=reg,
        )
        self._ended = Gauge(
            "loadgen_run_timestamp_seconds", "Unix time the run ended", names, registry=reg
        )
        # --depth: the level read at its depth (the standard series carry the depth labels too)
        self._depth_dists = _stat_gauges(_DEPTH_DISTS, names, reg)
        self._depth_hit = Gauge(
            "loadgen_depth_cache_hit_ratio",
            "Cached / prompt tokens of the level's requests (usage.cached_tokens)",
            names,
            registry=reg,
        )
        # --workload agent, one series per turn (the level's own series above cover the run)
        self._turn_dists = _stat_gauges(_TURN_DISTS, [*names, "turn"], reg)
        self._turn_hit = Gauge(
            "loadgen_agent_prefix_cache_hit_ratio",
            "Cached / prompt tokens of one agent turn (usage.cached_tokens)",
            [*names, "turn"],
            registry=reg,
        )
        self._run_hit = Gauge(
            "loadgen_prefix_cache_hit_ratio",
            "Prefix-cache hits / queries over the run (the engine's vllm:prefix_cache_*)",
            names,
            registry=reg,
        )

    def labels(self, concurrency: int | None, depth: DepthRun | None = None) -> dict[str, str]:
        return {
            **self._const,
            "concurrency": str(concurrency) if concurrency else "unbounded",
            "depth": str(depth.tokens) if depth is not None else "",
            "depth_mode": depth.mode if depth is not None else "",
        }

    def record(self, level: LevelResult, ended_unix: float | None = None) -> None:
        labels = self.labels(level.concurrency, level.depth)
        s = level.summary
        if level.depth is not None:
            self._record_depth(level, labels)
        _set_stats(self._dists, s, labels)
        if s.output_tok_s is not None:
            self._output.labels(**labels).set(s.output_tok_s)
        if s.total_tok_s is not None:
            self._total.labels(**labels).set(s.total_tok_s)
        self._requests.labels(**labels, outcome="ok").set(s.requests_ok)
        self._requests.labels(**labels, outcome="failed").set(s.requests_failed)
        self._ended.labels(**labels).set(ended_unix if ended_unix is not None else time.time())

    def _record_depth(self, level: LevelResult, labels: dict[str, str]) -> None:
        assert level.depth is not None
        d = summarize_depth(level.depth, level.requests)
        _set_stats(self._depth_dists, d, labels)
        if d.hit_rate is not None:
            self._depth_hit.labels(**labels).set(d.hit_rate)

    def record_report(self, report: Report) -> None:
        for level in report.levels:
            self.record(level, report.ended_unix)
        if report.agent is not None:
            self.record_agent(report.agent)

    def record_agent(self, agent: AgentResult) -> None:
        labels = self.labels(agent.sessions)
        for turn in agent.per_turn:
            _set_stats(self._turn_dists, turn, {**labels, "turn": str(turn.turn)})
            if turn.cache_hit_rate is not None:
                self._turn_hit.labels(**labels, turn=str(turn.turn)).set(turn.cache_hit_rate)
        rate = (agent.prefix_cache or {}).get("hit_rate")
        if rate is not None:
            self._run_hit.labels(**labels).set(rate)

    def push(self, gateway: str, run_id: str) -> None:
        try:
            push_to_gateway(
                gateway,
                job="loadgen",
                registry=self.registry,
                grouping_key={"run_id": run_id},
                timeout=10,
            )
        except OSError as exc:
            raise ExportError(
                f"cannot push to the Pushgateway at {gateway} ({exc}): check --pushgateway;"
                " the results above and any --json file are complete"
            ) from None


def _stat_gauges(
    table: dict[str, tuple[str, str]], labels: list[str], reg: CollectorRegistry
) -> dict[str, Gauge]:
    """A gauge per Dist of ``table`` (key: (name, doc)), labelled ``labels`` and the stat."""
    return {
        key: Gauge(name, doc, [*labels, "stat"], registry=reg) for key, (name, doc) in table.items()
    }


def _set_stats(gauges: dict[str, Gauge], source: object, labels: dict[str, str]) -> None:
    """Each of :func:`_stat_gauges`' ``gauges`` set, per stat, from the Dist ``source`` holds
    under the gauge's key (a stat the Dist lacks is left unset)."""
    for key, gauge in gauges.items():
        d: Dist = getattr(source, key)
        for stat in STATS:
            value = d.get(stat)
            if value is not None:
                gauge.labels(**labels, stat=stat).set(value)


@contextmanager
def serving(metrics: Metrics, port: int | None) -> Iterator[None]:
    """Serve the registry on `port` (all interfaces) while the block runs; no-op for None."""
    if port is None:
        yield
        return
    try:
        server, thread = start_http_server(port, registry=metrics.registry)
    except OSError as exc:
        raise ExportError(
            f"cannot serve metrics on port {port} ({exc.strerror or exc}):"
            " pick a free --metrics-port"
        ) from None
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
