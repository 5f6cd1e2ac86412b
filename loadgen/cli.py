"""Command line: builds a Config, calls the API, renders, exports; errors become exit codes here.

Exit codes: 0 all requests ok; 1 the target, an export, or some requests failed; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from loadgen.agent import parse_system_tokens
from loadgen.api import Hooks, run
from loadgen.config import (
    DEFAULT_URL,
    Config,
    parse_context,
    parse_label,
    parse_sweep,
    server_root,
    unwritable_output,
    validate,
)
from loadgen.depth import DepthRun, parse_depths, parse_tokens
from loadgen.errors import BadArgument, ExportError, LoadgenError, RunFailed
from loadgen.outputs.export import Metrics, serving
from loadgen.outputs.report import (
    format_agent_table,
    format_notes,
    format_table,
    write_outputs,
    write_text,
)
from loadgen.outputs.results import LevelResult, Report
from loadgen.runner import window
from loadgen.stats import summarize
from loadgen.target import Target
from loadgen.timing import Expected, RawRequest, RequestResult, measure


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and the same exit path as every other error."""

    def error(self, message: str) -> NoReturn:
        raise BadArgument(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="loadgen",
        description="Measure prefill against token generation over an OpenAI-compatible API."
        " `loadgen compare A.json B.json` compares two results.",
    )
    p.add_argument("--url", default=DEFAULT_URL, help="server base URL (default %(default)s)")
    p.add_argument("--model", help="served model name (default: the first of /v1/models)")
    p.add_argument(
        "--api-key",
        help=f"bearer token for the server (default: ${API_KEY_ENV}, else $OPENAI_API_KEY;"
        " the environment keeps it out of `ps`)",
    )
    p.add_argument("--prompt", type=int, default=512,
                   help="prompt tokens per request, exact (default 512)")
    p.add_argument(
        "--gen", type=int, help="generated tokens per request, exact (default 256; agent 64)"
    )
    p.add_argument(
        "--chat", action="store_true", help="use /v1/chat/completions (text fitted via /tokenize)"
    )
    p.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        metavar="N",
        help="first N prompt tokens shared by all requests (prefix cache on purpose; "
        "default 0)",
    )
    p.add_argument(
        "--seed",
        type=int,
        help="prompt and arrival seed (default: a fresh one per run, so no prompt of an earlier"
        " run is found in the server's prefix cache; the JSON records the one used)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        help="closed loop: streams in flight (default 1); with --rate: cap on requests in flight",
    )
    p.add_argument(
        "--sweep",
        type=parse_sweep_arg,
        default=(),
        metavar="C1,C2,...",
        help="one closed-loop run per concurrency, e.g. 1,2,4,8,16",
    )
    p.add_argument("--rate", type=float, help="open loop: requests per second")
    p.add_argument("--arrivals", default="poisson", help="open-loop arrivals: poisson or constant")
    load = p.add_mutually_exclusive_group()
    load.add_argument(
        "--requests", type=int, help="measured requests per run (default 4×concurrency, at least 8)"
    )
    load.add_argument(
        "--duration", type=float, help="seconds to keep sending, instead of --requests"
    )
    warm = p.add_mutually_exclusive_group()
    warm.add_argument(
        "--warmup",
        type=int,
        metavar="N",
        help="unmeasured requests before each level (default: one per stream, at least 2)",
    )
    warm.add_argument(
        "--no-warmup",
        action="store_true",
        help="measure from the first request (an engine's first requests are slow)",
    )
    p.add_argument(
        "--depth",
        type=parse_depths_arg,
        default=(),
        metavar="D[,D...]",
        help="measure after D tokens of context (cached unless --depth-cold); a sweep like"
        " 0,8k,32k (k, m: x1000; K, M: x1024)",
    )
    p.add_argument(
        "--depth-cold",
        action="store_true",
        help="--depth with a fresh context per request (nothing of it cached)",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="drive the load from N processes, one event loop each (for very high token "
        "rates; default 1)",
    )
    p.add_argument(
        "--pptg", action="store_true", help="llama-bench style ppN/tgN single-stream tests"
    )
    p.add_argument("--repetitions", "-r", type=int, default=5,
                   help="repetitions for --pptg (default 5)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="per-request timeout, seconds (default 600)")
    p.add_argument("--json", type=Path, help="write results as JSON")
    p.add_argument("--csv", type=Path, help="write one row per request as CSV")
    p.add_argument("--plot", type=Path, help="draw a sweep to this PNG")
    p.add_argument("--pushgateway", help="push loadgen_* metrics to this Pushgateway URL")
    p.add_argument(
        "--metrics-port", type=int, help="serve loadgen_* metrics on this port during the run"
    )
    p.add_argument(
        "--metrics-linger",
        type=float,
        default=15.0,
        help="keep --metrics-port up this long after the run so it is scraped (default 15 s)",
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        type=parse_label_arg,
        metavar="K=V",
        help="extra label on every exported series (repeatable)",
    )
    p.add_argument("--run-id", help="run id label (default: random)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--tokenizer",
        metavar="PATH_OR_HUB_ID",
        help="count prompts with this Hugging Face tokenizer instead of the target's /tokenize"
        " (any OpenAI-compatible server; honours HF_HOME, HF_HUB_OFFLINE, HF_ENDPOINT)",
    )
    p.add_argument(
        "--strict-counts",
        action="store_true",
        help="fail a request whose prompt the server counted differently from --tokenizer"
        " (default: reported, figures kept)",
    )
    agent = p.add_argument_group("agent workload (--workload agent)")
    p.add_argument(
        "--workload",
        default="standard",
        help="standard (default) or agent: sessions resending a growing conversation",
    )
    agent.add_argument("--sessions", type=int, default=4, help="concurrent sessions (default 4)")
    agent.add_argument("--turns", type=int, help="turns per session (default 10)")
    agent.add_argument(
        "--soak-tokens",
        type=parse_tokens_arg,
        metavar="N",
        help="keep taking turns until each conversation has crossed N tokens (e.g. 64k);"
        " sets --turns",
    )
    agent.add_argument(
        "--turn-tokens",
        type=parse_tokens_arg,
        default=2000,
        metavar="G",
        help="with --soak-tokens: tokens each turn adds (default 2000)",
    )
    agent.add_argument(
        "--context",
        type=parse_context_arg,
        metavar="FIRST:LAST",
        help="prompt tokens at the first and the last turn (default 2000:30000, capped to the"
        " model's context)",
    )
    agent.add_argument(
        "--think", type=float, default=1.0, help="seconds between a session's turns (default 1)"
    )
    agent.add_argument(
        "--system-tokens",
        type=parse_system_tokens_arg,
        metavar="N",
        help="the system prompt every session opens with, the same in all and so cached across"
        " sessions, in tokens (e.g. 2k); default a quarter of turn 1; 0 or off: none",
    )
    slo = p.add_argument_group("service-level objectives")
    slo.add_argument("--slo-ttft-ms", type=float, help="a request meets the SLO within this TTFT")
    slo.add_argument("--slo-tpot-ms", type=float, help="... and within this time per output token")
    slo.add_argument(
        "--slo-share",
        type=float,
        default=0.9,
        help="share of requests that must meet it for a level to count (default 0.9)",
    )
    p.add_argument(
        "--metrics-url",
        help="the engine's /metrics for vllm:prefix_cache_* (default: the target's own /metrics)",
    )
    p.add_argument(
        "--gpu-sample",
        type=float,
        default=2.0,
        help="seconds between samples of the target's toposerve GPU metrics (default 2; 0: off)",
    )
    return p


def parse_context_arg(text: str) -> tuple[int, int]:
    try:
        return parse_context(text)
    except BadArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_depths_arg(text: str) -> tuple[int, ...]:
    try:
        return parse_depths(text)
    except BadArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_tokens_arg(text: str) -> int:
    try:
        return parse_tokens(text)
    except BadArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_system_tokens_arg(text: str) -> int:
    try:
        return parse_system_tokens(text)
    except BadArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_sweep_arg(text: str) -> tuple[int, ...]:
    try:
        return parse_sweep(text)
    except BadArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_label_arg(text: str) -> tuple[str, str]:
    try:
        return parse_label(text)
    except BadArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


API_KEY_ENV = "TOPOSERVE_API_KEY"


def api_key_from_env(env: Mapping[str, str]) -> str | None:
    """The key when --api-key is not given: TOPOSERVE_API_KEY (what `launcher tune` sets, so the
    key is not on the command line), else OPENAI_API_KEY (what the ready banner exports)."""
    return env.get(API_KEY_ENV) or env.get("OPENAI_API_KEY") or None


def config_from(args: argparse.Namespace) -> Config:
    extra: dict[str, Any] = {"run_id": args.run_id} if args.run_id else {}
    if args.seed is not None:
        extra["seed"] = args.seed
    agent = args.workload == "agent"
    # An agent's answer is short: 64 tokens unless --gen says otherwise.
    gen = args.gen if args.gen is not None else (64 if agent else 256)
    if args.soak_tokens is not None and args.turns is not None:
        raise BadArgument("--soak-tokens sets the number of turns: drop --turns")
    return validate(
        Config(
            url=server_root(args.url),
            model=args.model,
            api_key=args.api_key or api_key_from_env(os.environ),
            prompt=args.prompt,
            gen=gen,
            chat=args.chat or agent,
            shared_prefix=args.shared_prefix,
            concurrency=args.concurrency,
            rate=args.rate,
            arrivals=args.arrivals,
            requests=args.requests,
            duration=args.duration,
            warmup=0 if args.no_warmup else args.warmup,
            sweep=args.sweep,
            processes=args.processes,
            pptg=args.pptg,
            repetitions=args.repetitions,
            timeout_s=args.timeout,
            json_path=args.json,
            csv_path=args.csv,
            plot_path=args.plot,
            pushgateway=args.pushgateway,
            metrics_port=args.metrics_port,
            metrics_linger=args.metrics_linger,
            labels=tuple(args.label),
            progress=not args.no_progress,
            tokenizer=args.tokenizer,
            workload=args.workload,
            sessions=args.sessions,
            turns=args.turns if args.turns is not None else 10,
            soak_tokens=args.soak_tokens,
            turn_tokens=args.turn_tokens,
            system_tokens=args.system_tokens,
            strict_counts=args.strict_counts,
            depth=args.depth,
            depth_cold=args.depth_cold,
            context=args.context,
            think_s=args.think,
            slo_ttft_ms=args.slo_ttft_ms,
            slo_tpot_ms=args.slo_tpot_ms,
            slo_share=args.slo_share,
            metrics_url=args.metrics_url,
            gpu_sample_s=args.gpu_sample,
            **extra,
        )
    )


class TerminalHooks(Hooks):
    """Progress bar on stderr, refreshed from the loop's ticks (no refresh thread competing
    with the loop for the GIL); live metrics when a metrics port is served."""

    def __init__(self, config: Config, err: Console, stack: ExitStack) -> None:
        self.config = config
        self.stack = stack
        self.metrics: Metrics | None = None
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            console=err,
            auto_refresh=False,
            transient=True,
            disable=not config.progress or not err.is_terminal,
        )
        self.task: TaskID | None = None
        self._measured: dict[int, RequestResult] = {}
        self._concurrency: int | None = None
        self._depth: DepthRun | None = None

    def prepared(self, target: Target) -> None:
        cfg = self.config
        if cfg.pushgateway or cfg.metrics_port is not None:
            self.metrics = Metrics(cfg, target)
            self.stack.enter_context(serving(self.metrics, cfg.metrics_port))
        self.stack.enter_context(self.progress)

    def level_started(
        self,
        concurrency: int | None,
        total: int | None,
        duration: float | None,
        depth: DepthRun | None = None,
    ) -> None:
        self._concurrency = concurrency
        self._depth = depth
        self._measured = {}
        label = f"concurrency {concurrency}" if concurrency else f"rate {self.config.rate}/s"
        if depth is not None:
            label = f"depth {depth.tokens} {depth.mode}, {label}"
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(label, total=total, rate="")
        self.progress.refresh()

    def tick(self, count: int, elapsed: float, finished: Sequence[RawRequest]) -> None:
        if self.task is not None:
            tokens = count * self.config.gen / elapsed if elapsed > 0 else 0.0
            self.progress.update(self.task, completed=count, rate=f"~{tokens:,.0f} out tok/s")
            self.progress.refresh()
        if self.metrics is not None and self.config.metrics_port is not None and finished:
            self._live(finished)

    def _live(self, finished: Sequence[RawRequest]) -> None:
        context = self._depth.tokens if self._depth is not None else 0
        expected = Expected(context + self.config.prompt, self.config.gen, strict_prompt=False)
        for raw in finished[len(self._measured) :]:
            self._measured[raw.index] = measure(raw, expected)
        summary = summarize(list(self._measured.values()), window(tuple(finished)))
        assert self.metrics is not None
        live = LevelResult(self._concurrency, self.config.rate, summary, (), depth=self._depth)
        self.metrics.record(live)

    def level_done(self, level: LevelResult) -> None:
        if self.metrics is not None:
            self.metrics.record(level)
            if self.config.pushgateway:
                # A sweep's levels show up as they finish; a failed push is not fatal here:
                # the push after the outputs are written reports it.
                with contextlib.suppress(ExportError):
                    self.metrics.push(self.config.pushgateway, self.config.run_id)


def run_command(config: Config, out: Console, err: Console) -> int:
    if config.pptg:
        return pptg_command(config, out)
    with ExitStack() as stack:
        hooks = TerminalHooks(config, err, stack)
        report = run(config, hooks)
        stack.pop_all().close()  # progress bar gone before the table is printed
        render(report, out)
        write_outputs(report)
        if config.plot_path:
            from loadgen.outputs.plot import draw

            draw(report, config.plot_path)
        if hooks.metrics is not None:
            hooks.metrics.record_report(report)
            if config.pushgateway:
                hooks.metrics.push(config.pushgateway, config.run_id)
            if config.metrics_port is not None:
                linger(hooks, config, err)
    raise_for_failures(report)
    return 0


def linger(hooks: TerminalHooks, config: Config, err: Console) -> None:
    assert hooks.metrics is not None
    with serving(hooks.metrics, config.metrics_port):
        err.print(
            f"serving final metrics on :{config.metrics_port} for {config.metrics_linger:g} s"
        )
        time.sleep(config.metrics_linger)


def render(report: Report, out: Console) -> None:
    out.print(format_table(report))
    if report.agent is not None:
        out.print(format_agent_table(report.agent))
    for note in format_notes(report):
        out.print(note, highlight=False, soft_wrap=True)


def raise_for_failures(report: Report) -> None:
    failed = sum(lv.summary.requests_failed for lv in report.levels)
    total = failed + sum(lv.summary.requests_ok for lv in report.levels)
    if failed:
        reasons: dict[str, int] = {}
        for lv in report.levels:
            for reason, n in lv.summary.failures.items():
                reasons[reason] = reasons.get(reason, 0) + n
        top = max(reasons, key=lambda k: reasons[k])
        raise RunFailed(f"{failed} of {total} requests failed (most: {reasons[top]}× {top})")


def pptg_command(config: Config, out: Console) -> int:
    from loadgen.pptg import format_pptg, pptg_dict, run_pptg

    if config.chat:
        raise BadArgument("--pptg sends token-id prompts (1-token for tg): drop --chat")
    report = run_pptg(config)
    out.print(format_pptg(report))
    if config.json_path:
        write_text(config.json_path, json.dumps(pptg_dict(report), indent=2) + "\n")
    if report.failures:
        raise RunFailed(f"{len(report.failures)} pp/tg requests failed: {report.failures[0]}")
    return 0


def compare_command(argv: list[str], out: Console) -> int:
    from loadgen.outputs.compare import format_comparison, load

    p = _Parser(prog="loadgen compare", description="B/A ratios of two --json results")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    args = p.parse_args(argv)
    out.print(format_comparison(load(args.a), load(args.b), str(args.a), str(args.b)))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out, err = Console(), Console(stderr=True)
    try:
        if argv[:1] == ["compare"]:
            return compare_command(argv[1:], out)
        args = build_parser().parse_args(argv)
        config = config_from(args)
        unwritable = unwritable_output(config)
        if unwritable:
            raise BadArgument(unwritable)
        return run_command(config, out, err)
    except LoadgenError as exc:
        err.print(f"loadgen: error: {exc}", highlight=False, markup=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("loadgen: interrupted")
        return 130
