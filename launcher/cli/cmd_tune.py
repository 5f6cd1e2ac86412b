"""`launcher tune`: start each candidate plan in turn, measure it with loadgen, keep the best.

Each candidate runs exactly as `launcher serve` would run it (same plan, same proxy), and loadgen
measures it through the proxy with the same CLI a user runs, so the comparison is the real thing.
Per start: warm-up requests (not counted), then ``--repeats`` rounds, one loadgen run and one
score each; the decisions (interval, early stop, finalists' re-run, the winner) are the pure
:mod:`launcher.tune.loop` / :mod:`launcher.tune.stats`. The winner is written as a plan file that
`launcher serve --plan FILE` uses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from launcher.cli import argtypes, planopts
from launcher.cli.apikeys import collect_api_keys
from launcher.engine.launchspec import LaunchSpec
from launcher.engine.serve import Runner, StopCut, StopRequested, Supervision
from launcher.errors import LauncherError
from launcher.model import tinymodel
from launcher.pipeline.requests import EngineRequest, ServeRequest
from launcher.pipeline.run import Planned, launch_spec, plan_and_render, plan_file
from launcher.planner.plantypes import Workload
from launcher.tune.loop import (
    OBJECTIVES,
    CandidateSpec,
    Measured,
    Round,
    Slo,
    Verdict,
    choose,
    intervals_of,
    judge,
    parse_candidate,
    request_tpot_s,
    resolve_objective,
    stop_rounds,
)
from launcher.tune.stats import CONFIDENCE, next_step

TABLE_WIDTH = 120
LOAD_STREAMS = 16  # --concurrency: what the throughput and slo objectives are measured with
CPU_DEFAULT_CANDIDATES = (
    "name=default",
    "name=small-prefill-chunks --max-num-batched-tokens 256",
)


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "tune", help="A/B the candidate plans with loadgen and keep the best",
        description="Start each candidate plan in turn, measure it through the proxy with "
        "loadgen, print the comparison and write the winner for `launcher serve --plan`.")
    planopts.add_planning_arguments(
        p, model_help="model directory or HF id (default: the embedded model)",
        concurrency_help=f"streams of load the throughput and slo objectives are measured "
        f"with (default {LOAD_STREAMS}; the interactive objective measures one)")
    # tune measures with loadgen at this concurrency too, so it needs a number, not "planner's"
    p.set_defaults(concurrency=LOAD_STREAMS)
    p.add_argument("--candidate", action="append", default=[], metavar="SPEC",
                   help="a candidate: 'tp=2', 'pp=2', 'tp=2 dp=2', or 'name=x --vllm-flag v' "
                   "(use --candidate='...' when SPEC starts with --). Default: the planner's "
                   "best three, or two engine settings on the CPU")
    p.add_argument("--requests", type=argtypes.count, help="measured requests per round (default 3 "
                   "interactive, 4x concurrency throughput)")
    p.add_argument("--objective", choices=OBJECTIVES, help="what wins: interactive, "
                   "throughput, or slo (the highest throughput meeting --slo-ttft-ms/"
                   "--slo-tpot-ms); default: slo when a bound is given, else --workload")
    p.add_argument("--slo-ttft-ms", type=argtypes.positive, help="SLO: time to first token, ms")
    p.add_argument("--slo-tpot-ms", type=argtypes.positive,
                   help="SLO: time per output token after the "
                   "first, ms")
    p.add_argument("--repeats", type=argtypes.count, default=3,
                   help="measured rounds per candidate, "
                   "for a 95%% t-interval of its score (default 3)")
    p.add_argument("--warmup", type=argtypes.whole, default=2,
                   help="unmeasured requests before each "
                   "start's first round (default 2)")
    p.add_argument("--reruns", type=argtypes.whole, default=1, help="times the two finalists are "
                   "started and measured again while their intervals overlap (default 1)")
    p.add_argument("--out", type=argtypes.path, default=Path("tuned-plan.json"),
                   help="where the winner's plan is written, for `launcher serve --plan` "
                   "(default tuned-plan.json)")
    p.add_argument("--results-dir", type=argtypes.path, help="keep each candidate's loadgen "
                   "JSON here (default: a new temporary folder)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address each candidate's proxy binds (default 127.0.0.1)")
    p.add_argument("--port", type=argtypes.port, default=8000,
                   help="each candidate's proxy port, which loadgen measures (default 8000)")
    p.add_argument("--api-key", action="append", default=[],
                   help="the candidates' proxy requires this key, and loadgen sends it (repeat "
                   "for several); also TOPOSERVE_API_KEYS=k1,k2")
    p.add_argument("--ready-timeout", type=argtypes.positive, default=900.0,
                   help="seconds to wait for each candidate's vLLM (default 900)")
    p.add_argument("--log-dir", type=argtypes.path, help="where vLLM and proxy logs go (default: "
                   "logs/ in toposerve's cache)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: flags for every candidate")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True)
    slo = Slo(args.slo_ttft_ms, args.slo_tpot_ms)
    objective = resolve_objective(args.objective, args.workload, slo)
    for label, value, least in (("--repeats", args.repeats, 1), ("--warmup", args.warmup, 0),
                                ("--reruns", args.reruns, 0)):
        if value < least:
            raise LauncherError(f"{label} must be at least {least}, got {value}")
    keys = collect_api_keys(args.api_key, None, os.environ)
    specs = [parse_candidate(c) for c in args.candidate] or default_candidates(args)
    names = [c.name for c in specs]
    if len(set(names)) != len(names):
        raise LauncherError(f"candidates need distinct names (got {names}); add name=... to each")
    # Checked before the first candidate starts: the plan is written only after every candidate
    # has been measured (minutes to hours), and the rounds' files as they come.
    check_writable(args.out, "--out")
    results_dir = args.results_dir or Path(tempfile.mkdtemp(prefix="toposerve-tune-"))
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LauncherError(f"--results-dir {results_dir}: cannot make that folder "
                            f"({exc.strerror or exc}); pass a folder you can write") from None
    check_takes_files(results_dir, "--results-dir", results_dir)
    # said now, not at the end: the rounds are kept there as they come, whatever ends the tune
    console.print(f"Each round's loadgen JSON is kept in {results_dir}")
    tuner = Tuner(args, keys, objective, slo, results_dir, console)
    measured: dict[str, Measured] = {}
    for cand in specs:
        measured[cand.name] = tuner.run(cand, measured, first=True)
    reruns = 0
    while True:
        step = next_step(intervals_of(tuner.verdicts(measured)), reruns, args.reruns)
        console.print(f"[bold]{step.reason}[/]")
        if step.action != "rerun":
            break
        reruns += 1
        for name in step.names:
            cand = next(c for c in specs if c.name == name)
            measured[name] = measured[name].plus(tuner.run(cand, measured, first=False))
    verdicts = tuner.verdicts(measured)
    best = choose(verdicts, objective, slo)
    in_order = [measured[c.name] for c in specs]
    # Piped to a file or a CI log, rich would squeeze the table into 80 columns.
    wide = console if console.is_terminal else Console(highlight=False, width=TABLE_WIDTH)
    wide.print(comparison(verdicts, in_order, best, objective, slo))
    for line in table_notes(verdicts, in_order):
        console.print(line)
    document = tuned_document(tuner.plans[best.name], best, verdicts, measured, args, objective,
                              slo, step.reason)
    text = json.dumps(document, indent=2) + "\n"
    try:
        write_whole(args.out, text)
    except OSError as exc:
        # The measurements took minutes to hours: they go to stdout, where the plan file
        # would have held them, rather than with the file (vllm bench and guidellm print their
        # results before writing them, and lose nothing printed when the write fails).
        print(f"The plan and the measurements tune could not write to {args.out}:")
        print(text, end="", flush=True)
        raise LauncherError(
            f"--out {args.out}: cannot write the plan ({exc.strerror or exc}); it is printed "
            f"above, and each round's loadgen JSON is in {results_dir}: save the JSON above to "
            "a file and serve it with `launcher serve --plan FILE`") from None
    console.print(f"Winner for {objective}: [bold]{best.name}[/]; plan written to "
                  f"{args.out} — serve it with `launcher serve --plan {args.out}`")
    return 0


def check_writable(path: Path, flag: str) -> None:
    """``path`` can be written as a file: it is no folder, and its folder takes files."""
    if path.is_dir():
        raise LauncherError(f"{flag} {path} is a folder: pass the path of a file to write")
    check_takes_files(path.parent, flag, path)


def check_takes_files(folder: Path, flag: str, shown: Path) -> None:
    """A new file can be made in ``folder``: one is created and removed again, which decides
    it whoever runs this (root passes every permission check but not a read-only mount)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".toposerve-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise LauncherError(f"{flag} {shown}: cannot write there ({exc.strerror or exc}); pass a "
                            "path in a folder you can write") from None


def default_candidates(args: argparse.Namespace) -> list[CandidateSpec]:
    from launcher.model.modelspec import load_model_spec
    from launcher.pipeline.run import choose, resolve_model
    from launcher.probe.topology import load_topology

    topo = load_topology(args.topology, os.environ)
    if not topo.gpus:
        return [parse_candidate(c) for c in CPU_DEFAULT_CANDIDATES]
    request = planopts.plan_request(args, EngineRequest(extra_args=tune_extra_args(args)))
    model = load_model_spec(resolve_model(args.model)[0], revision=args.revision)
    chosen = choose(request, model, topo, os.environ).plan
    viable = [c for c in chosen.candidates if not c.rejected]
    workload = "interactive" if objective_of(args) == "interactive" else "throughput"
    ranked = sorted(viable, key=lambda c: _candidate_score(c, workload), reverse=True)
    return [CandidateSpec(f"tp={c.tp} pp={c.pp} dp={c.dp}", c.tp, c.pp, c.dp)
            for c in ranked[:3]]


def _candidate_score(c: Any, workload: str) -> float:
    scores = getattr(c, "scores", None)
    if scores is not None:
        return float(getattr(scores, workload, 0.0) or 0.0)
    pred = c.predicted
    return float(pred.throughput_tok_s if workload == "throughput" else pred.decode_tok_s)


def tune_extra_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The vLLM flags after -- that every candidate gets."""
    return tuple(a for a in (args.extra or []) if a != "--")


def candidate_request(args: argparse.Namespace, cand: CandidateSpec,
                      keys: tuple[str, ...]) -> ServeRequest:
    """One candidate's start, typed: tune's options with the candidate's layout and flags, and
    the plan sized for the load tune puts on it (one stream, or --concurrency of them)."""
    # only the tune's loadgen talks to the engine, through the proxy: loopback, a free port
    engine = EngineRequest(host="127.0.0.1", port=None,
                           extra_args=(*cand.vllm_args, *tune_extra_args(args)),
                           cpu_ids=planopts.cpu_ids())
    base = planopts.plan_request(args, engine)
    workload: Workload = "interactive" if objective_of(args) == "interactive" else "throughput"
    policy = replace(base.policy, force_tp=cand.tp, force_pp=cand.pp, force_dp=cand.dp,
                     concurrency=load_concurrency(args), workload=workload)
    return ServeRequest(replace(base, policy=policy), host=args.host, port=args.port,
                        api_keys=keys)


def tuned_plan_json(planned: Planned) -> dict[str, Any]:
    """The candidate's plan as `launcher plan --json` prints it for the same options (the
    command tune measured, rendered once), plus its vLLM flags for `serve --plan`."""
    data = plan_file(planned)
    data["vllm_extra_args"] = list(planned.extra_args)
    return data


def objective_of(args: argparse.Namespace) -> str:
    return resolve_objective(args.objective, args.workload, Slo(args.slo_ttft_ms, args.slo_tpot_ms))


def load_concurrency(args: argparse.Namespace) -> int:
    """Streams of load: one for the interactive objective, --concurrency for the others."""
    return 1 if objective_of(args) == "interactive" else int(args.concurrency)


class Tuner:
    """Starts a candidate, warms it up, measures its rounds, and stops it."""

    def __init__(self, args: argparse.Namespace, keys: tuple[str, ...], objective: str, slo: Slo,
                 results: Path, console: Console) -> None:
        self.args, self.keys, self.objective, self.slo = args, keys, objective, slo
        self.results, self.console = results, console
        self.plans: dict[str, dict[str, Any]] = {}
        self.starts: dict[str, int] = {}

    def verdicts(self, measured: Mapping[str, Measured]) -> list[Verdict]:
        return [judge(m, self.objective, self.args.gen, self.slo) for m in measured.values()]

    def run(self, cand: CandidateSpec, others: Mapping[str, Measured], first: bool) -> Measured:
        """One start of ``cand``: warm-up, then up to --repeats rounds. Rounds stop early when a
        candidate already measured is clearly ahead of this one (or a round failed)."""
        args = self.args
        start_no = self.starts[cand.name] = self.starts.get(cand.name, 0) + 1
        self.console.rule(f"candidate {cand.name}" + ("" if first else f" (re-run {start_no - 1})"))
        request = candidate_request(args, cand, self.keys)
        planned = plan_and_render(request.plan, os.environ)
        spec = launch_spec(planned, request)
        if first:
            for line in spec.summary:
                self.console.print(line)
            self.plans[cand.name] = tuned_plan_json(planned)
        earlier = others.get(cand.name) if not first else None
        rivals = intervals_of(self.verdicts({n: m for n, m in others.items() if n != cand.name}))
        log_dir = args.log_dir or tinymodel.default_cache_dir(os.environ) / "logs"
        runner = Runner(spec, Supervision(ready_timeout_s=args.ready_timeout, restart_attempts=0,
                                          grace_s=10.0, log_dir=log_dir), self.console)
        rounds: list[Round] = []
        with runner.guard.installed():
            try:
                runner.start()
                for k in range(args.repeats):
                    out = self.results / f"{_slug(cand.name)}-start{start_no}-round{k + 1}.json"
                    # a stop ends the round at once (subprocess.run kills loadgen as the cut
                    # passes through it), not when its requests end: a supervisor's grace
                    # period is shorter than a round can be; its result is dropped whole
                    with runner.guard.cutting():
                        code, tail = run_loadgen(spec, args, out, args.warmup if k == 0 else 0)
                    if code != 0 or not out.exists():
                        return Measured(cand, tuple(rounds), f"loadgen exited {code}: {tail}")
                    rounds.append(Round.from_loadgen(json.loads(out.read_text())))
                    sofar = Measured(cand, tuple(rounds))
                    if earlier is not None:
                        sofar = earlier.plus(sofar)
                    v = judge(sofar, self.objective, args.gen, self.slo)
                    line = _round_line(v, len(sofar.rounds))
                    self.console.print(f"round {k + 1}/{args.repeats}: {line}")
                    stop = stop_rounds(v, len(sofar.rounds), rivals, k + 1, args.repeats)
                    if stop is not None:
                        self.console.print(stop)
                        return Measured(cand, tuple(rounds), note=stop)
            except (StopRequested, StopCut):
                raise KeyboardInterrupt from None
            except LauncherError as exc:
                return Measured(cand, tuple(rounds), str(exc))
            finally:
                runner.shutdown()
        return Measured(cand, tuple(rounds))


def _round_line(v: Verdict, rounds: int) -> str:
    if len(v.scores) < rounds:  # this round gave no score
        return v.excluded or "no score"
    iv = v.interval
    text = f"score {_fmt_score(v.scores[-1])}"
    if iv is not None and iv.bounded:
        text += f"; so far {_fmt_score(iv.mean)} [{_fmt_score(iv.low)}, {_fmt_score(iv.high)}]"
    if v.meets_slo is not None:
        text += f"; SLO {v.slo_met}/{v.slo_total} requests within"
    return text


def _fmt_score(x: float) -> str:
    return f"{x:,.4g}"


def run_loadgen(spec: LaunchSpec, args: argparse.Namespace, out: Path,
                warmup: int = 0) -> tuple[int, str]:
    conc = load_concurrency(args)
    requests = args.requests or (3 if conc == 1 else 4 * conc)
    argv = [sys.executable, "-m", "loadgen", "--url", f"http://{spec.host}:{spec.port}",
            "--prompt", str(args.prompt), "--gen", str(args.gen), "--concurrency", str(conc),
            "--requests", str(requests), "--warmup", str(warmup), "--no-progress",
            "--json", str(out)]
    # loadgen judges the SLO too (summary.slo); tune uses that verdict, or its own from the rows
    for flag, bound in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms)):
        if bound is not None:
            argv += [flag, str(bound)]
    env = dict(os.environ)
    if spec.api_keys:  # through the environment: a command line is visible to every user in ps
        env["TOPOSERVE_API_KEY"] = spec.api_keys[0]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    return res.returncode, (res.stderr or res.stdout).strip()[-300:]


def _pooled(m: Measured, key: str) -> list[float]:
    vals = []
    for r in m.rounds:
        for row in r.requests:
            if row.get("error") is None:
                x = request_tpot_s(row) if key == "tpot_s" else row.get(key)
                if isinstance(x, (int, float)):
                    vals.append(float(x))
    return vals


def _median(vals: Sequence[float]) -> float | None:
    return statistics.median(vals) if vals else None


def comparison(verdicts: Sequence[Verdict], results: Sequence[Measured], best: Verdict,
               objective: str, slo: Slo) -> Table:
    unit = "answers/s" if objective == "interactive" else "output tok/s"
    title = (f"launcher tune: measured through the proxy — objective {objective}"
             + (f" ({slo.describe()}, ≥90% of requests)" if objective == "slo" else ""))
    table = Table(title=title, box=box.SIMPLE_HEAD, caption=f"score: {unit}, mean of the "
                  f"rounds; {CONFIDENCE:.0%} CI: Student t over the rounds; TTFT, TPOT: "
                  "medians of all requests; goodput: output tok/s of requests within the SLO")
    cols = ["candidate", "rounds", "score", f"{CONFIDENCE:.0%} CI", "TTFT ms", "TPOT ms"]
    if objective == "slo":
        cols += ["SLO met", "goodput"]
    cols.append("")
    for col in cols:
        table.add_column(col, justify="left" if col in ("candidate", "") else "right",
                         no_wrap=col in ("candidate", f"{CONFIDENCE:.0%} CI"))
    by_name = {m.candidate.name: m for m in results}
    for v in verdicts:
        m = by_name[v.name]
        ttft, tpot = _median(_pooled(m, "ttft_s")), _median(_pooled(m, "tpot_s"))
        iv = v.interval
        row = [v.name, str(len(m.rounds)), "–" if iv is None else f"{iv.mean:,.4g}",
               "–" if iv is None else f"{iv.low:,.4g}–{iv.high:,.4g}" if iv.bounded
               else "one round", _fmt(ttft, 1000), _fmt(tpot, 1000)]
        if objective == "slo":
            goods = [g for g in (r.goodput_tok_s(slo) for r in m.rounds) if g is not None]
            row += [f"{'yes' if v.meets_slo else 'NO'} {v.slo_met}/{v.slo_total}",
                    _fmt(statistics.fmean(goods) if goods else None)]
        row.append("← best" if v is best else "excluded" if v.excluded else
                   "stopped early" if m.note else "")
        table.add_row(*row)
    return table


def table_notes(verdicts: Sequence[Verdict], results: Sequence[Measured]) -> list[str]:
    """The why of each 'excluded' / 'stopped early' mark, one line per candidate."""
    by_name = {m.candidate.name: m for m in results}
    lines = []
    for v in verdicts:
        m = by_name[v.name]
        if v.excluded:
            lines.append(f"{v.name}: excluded — {v.excluded}")
        elif m.note:
            lines.append(f"{v.name}: {m.note}")
    return lines


def _fmt(value: Any, scale: float = 1.0, digits: int = 1) -> str:
    return f"{float(value) * scale:,.{digits}f}" if isinstance(value, (int, float)) else "–"


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[:60] or "candidate"


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def tuned_document(plan_data: dict[str, Any], best: Verdict, verdicts: Sequence[Verdict],
                   measured: Mapping[str, Measured], args: argparse.Namespace, objective: str,
                   slo: Slo, decision: str) -> dict[str, Any]:
    """The winner's plan, for `launcher serve --plan`, and every candidate's measurements."""
    data = dict(plan_data)
    results = []
    for v in verdicts:
        m = measured[v.name]
        iv = v.interval
        results.append({
            "candidate": v.name, "ok": m.ok and v.excluded is None, "error": m.error,
            "excluded": v.excluded, "note": m.note, "rounds": len(m.rounds),
            "scores": list(v.scores), "score": iv.mean if iv else None,
            "low": _finite(iv.low) if iv else None, "high": _finite(iv.high) if iv else None,
            "meets_slo": v.meets_slo, "slo_met": v.slo_met, "slo_total": v.slo_total,
            "summary": dict(m.rounds[-1].summary) if m.rounds else {},
        })
    data["tuned"] = {
        "workload": args.workload, "objective": objective, "prompt": args.prompt,
        "gen": args.gen, "concurrency": load_concurrency(args),
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms} if slo.given else None,
        "repeats": args.repeats, "warmup": args.warmup, "reruns": args.reruns,
        "interval": f"{CONFIDENCE:.0%} Student t over rounds", "decision": decision,
        "winner": best.name, "results": results,
    }
    return data


def write_whole(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole, or is left as it was: a disk that fills up half-way leaves
    neither half a plan nor an earlier plan cut short, but the OSError.

    Written beside ``path`` and renamed over it (a rename within a folder is atomic). What is
    there already and no regular file (``/dev/stdout``, a FIFO) is written through instead:
    renamed over, it would be replaced."""
    if path.exists() and not path.is_file():
        with path.open("w") as fh:
            fh.write(text)
        return
    target = Path(os.path.realpath(path))  # a link to a plan: the plan it points to is replaced
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    data = text.encode()
    # mode 0o666 less the umask, as a file made by open() gets (mkstemp's 0o600 would not be)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
