"""Results as data (JSON, CSV rows) and as a rich table. `format_*`/`*_dict` are pure."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table

from loadgen.agent import AgentResult
from loadgen.depth import summarize_depth
from loadgen.errors import ExportError
from loadgen.gpus import GpuBalance
from loadgen.outputs.results import LevelResult, Report
from loadgen.slo import SloResult, best_level, met
from loadgen.stats import STATS, Dist, Summary
from loadgen.timing import RequestResult

MEASURES = ("ttft_s", "itl_s", "e2e_s", "prefill_tok_s", "decode_tok_s")


def dist_dict(d: Dist | None) -> dict[str, Any] | None:
    return asdict(d) if d is not None else None


def summary_dict(s: Summary) -> dict[str, Any]:
    data: dict[str, Any] = {
        "requests_ok": s.requests_ok,
        "requests_failed": s.requests_failed,
        "failures": s.failures,
    }
    for name in MEASURES:
        data[name] = dist_dict(getattr(s, name))
    data.update(output_tok_s=s.output_tok_s, total_tok_s=s.total_tok_s, duration_s=s.duration_s)
    data["send_lag_s"] = dist_dict(s.send_lag_s)
    data["headers_s"] = dist_dict(s.headers_s)
    data["tpot_s"] = dist_dict(s.tpot_s)
    data["max_in_flight"] = s.max_in_flight
    data["slo"] = slo_dict(s.slo)
    data["loop"] = (
        {"lag_s": dist_dict(s.loop.lag_s), "cpu_fraction": s.loop.cpu_fraction} if s.loop else None
    )
    return data


def slo_dict(s: SloResult | None) -> dict[str, Any] | None:
    """The SLO verdict of a level (key names documented in docs/loadgen.md; launcher tune
    reads them)."""
    if s is None:
        return None
    return {
        "ttft_ms": s.ttft_ms,
        "tpot_ms": s.tpot_ms,
        "required_share": s.required_share,
        "met": s.met,
        "total": s.total,
        "share": s.share,
        "meets": s.meets,
        "goodput_req_s": s.goodput_req_s,
        "goodput_tok_s": s.goodput_tok_s,
    }


def request_measures(r: RequestResult) -> dict[str, Any]:
    """The per-request fields every loadgen JSON shares (runs and pp/tg tests alike)."""
    return {
        "index": r.index,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "ttft_s": r.ttft_s,
        "e2e_s": r.e2e_s,
        "prefill_tok_s": r.prefill_tok_s,
        "decode_tok_s": r.decode_tok_s,
    }


def level_dict(report: Report, level: LevelResult) -> dict[str, Any]:
    config = report.config.public()
    config.update(
        concurrency=level.concurrency,
        rate=level.rate,
        model=report.target.model,
        plan=report.target.plan,
        max_model_len=report.target.max_model_len,
        exact_length=report.target.exact_length,
    )
    start = min((r.sent_at for r in level.requests), default=0.0)
    slo = report.config.slo()
    requests = [
        {
            **request_measures(r),
            "itl_s_max": max(r.itl_s) if r.itl_s else None,
            "send_lag_s": r.send_lag_s,
            "headers_s": r.headers_s,
            "error": r.error,
            "prompt_expected": r.prompt_expected,
            "cached_tokens": r.cached_tokens,
            "counted_by": r.counted_by,
            "chunks": r.chunks,
            "itl_even": r.itl_even,
            "tpot_s": r.tpot_s,
            "slo_met": met(r, slo) if slo is not None else None,
            # Seconds from the level's first send, on one monotonic clock: requests in flight
            # over time (was a burst really one?).
            "t_sent_s": r.sent_at - start,
            "t_first_token_s": r.first_at - start if r.first_at is not None else None,
            "t_end_s": r.done_at - start,
        }
        for r in level.requests
    ]
    summary = summary_dict(level.summary)
    summary["prompt_mismatch"] = prompt_mismatch(level.requests)
    out: dict[str, Any] = {"config": config, "summary": summary, "requests": requests}
    out["warmup"] = asdict(level.warmup) if level.warmup is not None else None
    if level.depth is not None:
        out["depth"] = depth_dict(level)
    return out


def depth_dict(level: LevelResult) -> dict[str, Any]:
    """--depth: the depth asked, the prime, and the level read at its depth (docs/loadgen.md)."""
    assert level.depth is not None
    d = level.depth
    s = summarize_depth(d, level.requests)
    prime = d.prime
    return {
        "tokens": d.tokens,
        "new_tokens": d.new_tokens,
        "mode": d.mode,
        "prime": (
            {**request_measures(prime), "error": prime.error, "cached_tokens": prime.cached_tokens}
            if prime is not None else None
        ),
        "cached_tokens": dist_dict(s.cached_tokens),
        "cached_reported": s.cached_reported,
        "hit_rate": s.hit_rate,
        "new_tokens_counted": dist_dict(s.new_tokens),
        "prefill_new_tok_s": dist_dict(s.prefill_new_tok_s),
        "uncached_tok_s": dist_dict(s.uncached_tok_s),
        "ttft_s": dist_dict(level.summary.ttft_s),
        "decode_tok_s": dist_dict(level.summary.decode_tok_s),
    }


def format_depth_notes(level: LevelResult) -> list[str]:
    assert level.depth is not None
    d = level.depth
    s = summarize_depth(d, level.requests)
    lines = []
    if d.prime is not None:
        failed = "" if d.prime.ok else f", failed: {d.prime.error}"
        lines.append(
            f"context primed by one unmeasured request (TTFT {_ms(d.prime.ttft_s)} ms{failed})"
        )
    prefill = f"prefill of the {d.new_tokens} new tokens p50 {_rate(s.prefill_new_tok_s.p50)} tok/s"
    if s.cached_reported:
        # What prefill really computed, beside the new tokens' rate: cold (or a context the
        # cache lost) it is the whole prompt, which the new tokens' rate alone would hide.
        lines.append(
            f"{d.mode}: cached tokens p50 {_whole(s.cached_tokens.p50)} of"
            f" {d.tokens + d.new_tokens} (hit rate {s.hit_rate or 0:.0%}, from usage); {prefill};"
            f" of every uncached token p50 {_rate(s.uncached_tok_s.p50)} tok/s"
        )
        if not d.cold and d.tokens and (s.cached_tokens.p50 or 0) < d.tokens / 2:
            # The context was sent once before, yet the measured requests found most of it
            # uncached: their figures are cold ones, which the mode alone would not say.
            lines.append(
                f"cached asked, but the measured requests found p50 {_whole(s.cached_tokens.p50)}"
                f" of the {d.tokens}-token context cached: the server's prefix cache is off or"
                " evicted it (vLLM: --enable-prefix-caching, a larger KV cache); these figures"
                " are close to --depth-cold's"
            )
    elif d.tokens:
        lines.append(
            f"{d.mode}: {prefill}; the server reported no cached tokens"
            " (vLLM: --enable-prompt-tokens-details)"
        )
    else:
        lines.append(prefill)
    return lines


def report_dict(report: Report) -> dict[str, Any]:
    """One level: the architecture.md schema. A sweep: {"config", "runs": [that schema, ...]}
    plus `slo_best`. Both add `prompts` (how prompts were made and counted)."""
    extra: dict[str, Any] = {"prompts": asdict(report.prompts) if report.prompts else None}
    if report.agent is not None:
        extra["agent"] = agent_dict(report.agent)
    if report.gpus is not None:
        extra["gpus"] = asdict(report.gpus)
    if len(report.levels) == 1:
        return {**level_dict(report, report.levels[0]), **extra}
    config = report.config.public()
    config.update(model=report.target.model, plan=report.target.plan,
                  exact_length=report.target.exact_length)
    runs = [level_dict(report, lv) for lv in report.levels]
    if report.config.slo() is not None:
        extra["slo_best"] = _slo_best(report)
    return {"config": config, "runs": runs, **extra}


def agent_dict(a: AgentResult) -> dict[str, Any]:
    """--workload agent: the per-turn table and the run's prefix cache (docs/loadgen.md)."""
    turns = []
    for t in a.per_turn:
        row: dict[str, Any] = {
            "turn": t.turn,
            "requests_ok": t.requests_ok,
            "requests_failed": t.requests_failed,
        }
        for key in ("prompt_tokens", "new_tokens", "ttft_s", "prefill_new_tok_s", "decode_tok_s"):
            row[key] = dist_dict(getattr(t, key))
        row.update(cached_tokens=t.cached_tokens, cache_hit_rate=t.cache_hit_rate)
        turns.append(row)
    ttft = _first_last_ttft(a)
    ratio = ttft[1] / ttft[0] if ttft else None
    return {
        "sessions": a.sessions,
        "turns": a.turns,
        "context": list(a.context),
        "think_s": a.think_s,
        "per_turn": turns,
        "ttft_last_over_first_p50": ratio,
        "prefix_cache": a.prefix_cache,
        "cache_source": a.cache_source,
    }


def _first_last_ttft(a: AgentResult) -> tuple[float, float] | None:
    """TTFT p50 of the first and the last turn, where both are known and the first is not 0."""
    first, last = a.per_turn[0].ttft_s.p50, a.per_turn[-1].ttft_s.p50
    return (first, last) if first and last is not None else None


def _best(report: Report) -> int | None:
    """The highest concurrency whose level met the SLO (None: no level did)."""
    return best_level([(lv.concurrency, lv.summary.slo) for lv in report.levels])


def _slo_best(report: Report) -> dict[str, Any]:
    """The highest concurrency whose level met the SLO (None: no level did) and its goodput."""
    best = _best(report)
    level = next((lv for lv in report.levels if lv.concurrency == best), None)
    s = level.summary.slo if level is not None else None
    return {
        "concurrency": best,
        "share": s.share if s else None,
        "goodput_req_s": s.goodput_req_s if s else None,
        "goodput_tok_s": s.goodput_tok_s if s else None,
        "output_tok_s": level.summary.output_tok_s if level else None,
    }


def csv_text(report: Report) -> str:
    """One row per request, with the level's concurrency and depth (empty without --depth)."""
    out = io.StringIO()
    fields = [
        "concurrency",
        "depth",
        "index",
        "prompt_tokens",
        "completion_tokens",
        "ttft_s",
        "e2e_s",
        "prefill_tok_s",
        "decode_tok_s",
        "itl_s_max",
        "send_lag_s",
        "t_sent_s",
        "t_first_token_s",
        "t_end_s",
        "error",
    ]
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for level in report.levels:
        for row in level_dict(report, level)["requests"]:
            depth = level.depth.tokens if level.depth is not None else None
            measures = {k: row[k] for k in fields[2:]}
            writer.writerow({"concurrency": level.concurrency, "depth": depth, **measures})
    return out.getvalue()


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise ExportError(
            f"cannot write {path}: {exc.strerror or exc}; pick a writable path"
        ) from None


def write_outputs(report: Report) -> None:
    cfg = report.config
    if cfg.json_path:
        write_text(cfg.json_path, json.dumps(report_dict(report), indent=2) + "\n")
    if cfg.csv_path:
        write_text(cfg.csv_path, csv_text(report))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _whole(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _sec(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


_ROWS = (
    ("TTFT ms", "ttft_s", _ms),
    ("prefill tok/s", "prefill_tok_s", _rate),
    ("decode tok/s", "decode_tok_s", _rate),
    ("ITL ms", "itl_s", _ms),
    ("e2e s", "e2e_s", _sec),
)


def _title(report: Report) -> str:
    cfg = report.config
    chat = " chat" if cfg.chat else ""
    sizes = f"prompt {cfg.prompt} / gen {cfg.gen}"
    if report.agent is not None:
        chat, sizes = " agent", f"context {report.agent.context[0]}:{report.agent.context[1]}"
        sizes += f" / gen {cfg.gen}"
    return f"{report.target.model}{chat}  {sizes}  plan {report.target.plan}"


def format_table(report: Report) -> Table:
    """One level: measures × mean/p50/p90/p99. A sweep: one row of p50s per concurrency.
    Depths: one row per depth (and concurrency), with the cached tokens and the new tokens'
    prefill."""
    if report.config.depth:
        return format_depth_table(report)
    if len(report.levels) == 1:
        return _level_table(report, report.levels[0])
    table = Table(title=_title(report), min_width=len(_title(report)) + 4)
    heads = ("conc", "ok/fail", "TTFT ms", "prefill t/s", "decode t/s", "ITL p99 ms", "out tok/s")
    for head in heads:
        table.add_column(head, justify="right")
    for level in report.levels:
        s = level.summary
        table.add_row(
            str(level.concurrency),
            f"{s.requests_ok}/{s.requests_failed}",
            _ms(s.ttft_s.p50),
            _rate(s.prefill_tok_s.p50),
            _rate(s.decode_tok_s.p50),
            _ms(s.itl_s.p99),
            _rate(s.output_tok_s),
        )
    table.caption = "TTFT, prefill and decode are per-request p50"
    return table


def format_depth_table(report: Report) -> Table:
    mode = "cold" if report.config.depth_cold else "cached"
    title = f"{_title(report)}  depth {mode}"
    table = Table(title=title, min_width=len(title) + 4)
    heads = ("depth", "conc", "ok/fail", "cached tok", "TTFT ms", "prefill new t/s",
             "decode t/s", "ITL p99 ms")
    for head in heads:
        table.add_column(head, justify="right")
    for level in report.levels:
        assert level.depth is not None
        s, d = level.summary, summarize_depth(level.depth, level.requests)
        table.add_row(
            str(level.depth.tokens),
            str(level.concurrency),
            f"{s.requests_ok}/{s.requests_failed}",
            _whole(d.cached_tokens.p50) if d.cached_reported else "-",
            _ms(s.ttft_s.p50),
            _rate(d.prefill_new_tok_s.p50),
            _rate(s.decode_tok_s.p50),
            _ms(s.itl_s.p99),
        )
    table.caption = (
        f"each request: depth + {report.config.prompt} new tokens; p50s; cached tokens from usage"
    )
    return table


def format_agent_table(a: AgentResult) -> Table:
    """One row per turn: prompt and new tokens, TTFT, prefill of the new tokens, decode, cache."""
    table = Table(
        title=f"agent: {a.sessions} sessions x {a.turns} turns, context"
        f" {a.context[0]}:{a.context[1]}, think {a.think_s:g} s"
    )
    heads = (
        "turn",
        "ok/fail",
        "prompt tok",
        "new tok",
        "TTFT ms",
        "prefill new t/s",
        "decode t/s",
        "cache hit",
    )
    for head in heads:
        table.add_column(head, justify="right")
    for t in a.per_turn:
        hit = f"{t.cache_hit_rate:.0%}" if t.cache_hit_rate is not None else "-"
        table.add_row(
            str(t.turn),
            f"{t.requests_ok}/{t.requests_failed}",
            _whole(t.prompt_tokens.mean),
            _whole(t.new_tokens.mean),
            _ms(t.ttft_s.p50),
            _rate(t.prefill_new_tok_s.p50),
            _rate(t.decode_tok_s.p50),
            hit,
        )
    table.caption = "means of tokens, p50 of the rest; cache hit from usage.cached_tokens"
    return table


def format_agent_notes(a: AgentResult) -> list[str]:
    notes = []
    if ttft := _first_last_ttft(a):
        first, last = ttft
        notes.append(
            f"agent: TTFT p50 of turn {a.turns} {_ms(last)} ms against turn 1 {_ms(first)} ms"
            f" ({last / first:.2f}x)"
        )
    pc = a.prefix_cache
    if pc is not None and pc.get("hit_rate") is not None:
        where = a.metrics_url or "the target's /metrics"
        notes.append(
            f"prefix cache over the run (the engines' counters from {where}):"
            f" {pc['hit_rate']:.1%} of {pc['queries']:,.0f} prompt tokens hit"
        )
    elif pc is None:
        notes.append(
            "prefix cache counters: none at the target's /metrics (neither vllm:prefix_cache_*"
            " nor the toposerve proxy's toposerve_engine_prefix_cache_*; pass --metrics-url"
            " http://ENGINE/metrics)"
        )
    if a.cache_source is None or "usage" not in a.cache_source:
        # the per-turn hit column is then all "-": say why, as the depth lines do
        notes.append(
            "cache hit per turn: the server reported no cached tokens in usage"
            " (vLLM: --enable-prompt-tokens-details, which `launcher serve` sets)"
        )
    return notes


def _at(level: LevelResult) -> str:
    where = f"concurrency {level.concurrency}"
    return f"depth {level.depth.tokens}, {where}" if level.depth is not None else where


def _load(level: LevelResult) -> str:
    if not level.rate:
        return f"concurrency {level.concurrency}"
    cap = f", at most {level.concurrency} in flight" if level.concurrency else ""
    return f"rate {level.rate:g}/s{cap}"


def _level_table(report: Report, level: LevelResult) -> Table:
    s = level.summary
    table = Table(title=_title(report), min_width=len(_title(report)) + 4)
    table.add_column("")
    for stat in STATS:
        table.add_column(stat, justify="right")
    for label, key, fmt in _ROWS:
        d: Dist = getattr(s, key)
        table.add_row(label, *(fmt(d.get(stat)) for stat in STATS))
    return table


def format_totals(level: LevelResult) -> str:
    s = level.summary
    return (
        f"{_load(level)}: {s.requests_ok} ok, {s.requests_failed} failed in {s.duration_s:.2f} s,"
        f" output {_rate(s.output_tok_s)} tok/s, total {_rate(s.total_tok_s)} tok/s"
    )


def format_notes(report: Report) -> list[str]:
    """Lines under the table: totals (one level), failures and why, send lag, loadgen's load."""
    notes = [format_totals(report.levels[0])] if len(report.levels) == 1 else []
    if report.levels and _same_warmup(report.levels):
        notes.append(format_warmup(report.levels[0], len(report.levels)))
    if report.prompts is not None:
        notes.append(report.prompts.line())
    if not report.target.exact_length:
        notes.append("outputs: the server refused min_tokens/ignore_eos, so requests went without"
                     f" them and end where the model stops, at most --gen {report.config.gen}"
                     " tokens; counts still come from the server's usage")
    if report.agent is not None:
        notes += format_agent_notes(report.agent)
    if report.gpus is not None:
        notes += format_gpus(report.gpus)
    if report.config.slo() is not None and len(report.levels) > 1:
        best = _best(report)
        found = f"concurrency {best}" if best is not None else "no level"
        notes.append(f"highest load meeting the SLO: {found}")
    for level in report.levels:
        s = level.summary
        at = f"{_at(level)}: " if len(report.levels) > 1 or level.depth is not None else ""
        total = s.requests_ok + s.requests_failed
        if not _same_warmup(report.levels):
            notes.append(f"{at}{format_warmup(level)}")
        if level.depth is not None:
            notes += [f"{at}{line}" for line in format_depth_notes(level)]
        if s.requests_failed:
            why = "; ".join(f"{n}× {reason}" for reason, n in s.failures.items())
            notes.append(f"{at}{s.requests_failed} of {total} requests failed: {why}")
        if s.slo is not None:
            notes.append(f"{at}{format_slo(s.slo)}")
        if (mismatch := prompt_mismatch(level.requests)) is not None:
            notes.append(f"{at}{_mismatch_line(mismatch, total, report)}")
        counted = sum(r.counted_by == "tokenizer" for r in level.requests)
        if counted:
            notes.append(f"{at}{counted} requests had no usage: output counted by the tokenizer")
        even = sum(r.itl_even for r in level.requests if r.ok)
        if even:
            notes.append(
                f"{at}{even} requests streamed several tokens per event with an unknown split:"
                " their ITL is each gap over the mean tokens per event"
            )
        if s.send_lag_s and s.send_lag_s.p99 is not None:
            notes.append(
                f"{at}send lag behind schedule p50 {_ms(s.send_lag_s.p50)} ms,"
                f" p99 {_ms(s.send_lag_s.p99)} ms, max {_ms(s.send_lag_s.max)} ms"
            )
        if s.loop:
            notes.append(
                f"{at}loadgen loop lag p99 {_ms(s.loop.lag_s.p99)} ms, CPU"
                f" {s.loop.cpu_fraction:.0%} of one core"
            )
            if s.loop.cpu_fraction > 0.8:
                notes.append(
                    f"{at}warning: loadgen itself was near one full core; timings may"
                    " be late: spread the load with --processes N"
                )
    return notes


def prompt_mismatch(requests: Sequence[RequestResult]) -> dict[str, int] | None:
    """Successful requests whose prompt the server counted other than asked: how many and by
    how much (server's count less the one asked); None when there are none."""
    offs = [
        r.prompt_tokens - r.prompt_expected
        for r in requests
        if r.ok and r.prompt_tokens is not None and r.prompt_expected is not None
        and r.prompt_tokens != r.prompt_expected
    ]
    if not offs:
        return None
    return {"requests": len(offs), "min_off": min(offs), "max_off": max(offs)}


def _mismatch_line(m: dict[str, int], total: int, report: Report) -> str:
    lo, hi = m["min_off"], m["max_off"]
    by = f"{lo:+d}" if lo == hi else f"{lo:+d} to {hi:+d}"
    prompts = report.prompts
    if prompts is not None and prompts.source == "tokenizer":
        return (
            f"{m['requests']} of {total} prompts: the server counted {by} tokens against the"
            f" tokenizer {prompts.tokenizer} (a BOS token, a chat template or another"
            " tokenizer?); figures kept, per request in --json; --strict-counts fails them"
        )
    return (
        f"{m['requests']} of {total} prompts were not the length asked (calibrated, {by}"
        " tokens; per request in --json)"
    )


def _same_warmup(levels: Sequence[LevelResult]) -> bool:
    """Whether one line tells every level's warm-up: none anywhere, or the same number of
    requests before each level, all of them ok."""
    present = [lv.warmup for lv in levels if lv.warmup is not None]
    if len(present) < len(levels):
        return not present
    return len({w.requests for w in present}) == 1 and all(w.ok == w.requests for w in present)


def format_warmup(level: LevelResult, levels: int = 1) -> str:
    w = level.warmup
    if w is None:
        return "warm-up: none (--no-warmup): the engine's first requests are measured"
    failed = f", {w.requests - w.ok} failed" if w.ok < w.requests else ""
    # Several levels: their warm-ups are alike (_same_warmup), their times in the JSON.
    took = f", {w.seconds:.2f} s" if levels == 1 else ""
    each = " each level" if levels > 1 else ""
    return (
        f"warm-up: {w.requests} unmeasured requests before measuring{each} ({w.ok} ok{failed}"
        f"{took}); --warmup N or --no-warmup to change"
    )


def format_gpus(g: GpuBalance) -> list[str]:
    """Per GPU beside the results: busy share and power over the run, and any flag."""
    lines = []
    for s in g.per_gpu:
        util = (
            f"busy {s.util_mean:.0%} mean / {s.util_max:.0%} max"
            if s.util_mean is not None
            else "busy -"
        )
        power = (
            f"power {s.power_mean_w:.0f} W mean / {s.power_max_w:.0f} W max"
            if s.power_mean_w is not None and s.power_max_w is not None
            else "power -"
        )
        lines.append(f"GPU {s.gpu} ({s.name or 'unnamed'}): {util}, {power} ({s.samples} samples)")
    for f in g.flagged:
        lines.append(
            f"warning: GPU {f.gpu} stays well below the others ({f.reason}):"
            " the split may be uneven"
        )
    if not g.per_gpu:
        lines.append("GPU metrics: the target stopped answering them during the run")
    return lines


def format_slo(s: SloResult) -> str:
    limits = [
        f"TTFT <= {s.ttft_ms:g} ms" if s.ttft_ms is not None else "",
        f"TPOT <= {s.tpot_ms:g} ms" if s.tpot_ms is not None else "",
    ]
    verdict = "meets" if s.meets else "misses"
    return (
        f"SLO {' and '.join(x for x in limits if x)}: {s.met} of {s.total} requests"
        f" ({s.share:.0%}; {verdict} the {s.required_share:.0%} asked), goodput"
        f" {_rate(s.goodput_req_s)} req/s, {_rate(s.goodput_tok_s)} output tok/s"
    )


def stat_rows(summary: Summary) -> dict[str, dict[str, float | None]]:
    return {name: {st: getattr(summary, name).get(st) for st in STATS} for name in MEASURES}
