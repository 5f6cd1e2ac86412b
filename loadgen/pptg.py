"""llama-bench style pp/tg: repeated single-stream prefill and decode, mean ± std.

ppP: one request of P prompt tokens and 1 generated token; rate = P / TTFT.
tgG: one request of 1 prompt token and G generated tokens; rate = (G − 1) / (last − first).
Each test runs once unmeasured first (llama-bench's warm-up), then `repetitions` times.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from loadgen.config import Config
from loadgen.errors import TargetError
from loadgen.outputs.report import request_measures
from loadgen.runner import Shape, drive, run_async
from loadgen.stats import Dist, dist
from loadgen.target import Target
from loadgen.timing import Expected, RequestResult, measure
from loadgen.transport import Client, Endpoint
from loadgen.workload import Workload, prepare


@dataclass(frozen=True)
class PpTgReport:
    config: Config
    target: Target
    pp: tuple[RequestResult, ...]
    tg: tuple[RequestResult, ...]

    @property
    def pp_rate(self) -> Dist:
        return dist([r.prefill_tok_s for r in self.pp if r.ok and r.prefill_tok_s])

    @property
    def tg_rate(self) -> Dist:
        return dist([r.decode_tok_s for r in self.tg if r.ok and r.decode_tok_s])

    @property
    def failures(self) -> list[str]:
        return [r.error for r in (*self.pp, *self.tg) if r.error]


def run_pptg(config: Config) -> PpTgReport:
    workload = prepare(config)
    if workload.prompts.info.format != "ids":
        # tg's 1-token prompt can only be a token id; text cannot be made that short exactly
        raise TargetError(
            "--pptg sends token-id prompts, which need a target with /tokenize (vLLM, the"
            " toposerve proxy); against this server use --prompt/--gen runs instead"
        )
    pp, tg = run_async(_both(workload))
    return PpTgReport(config, workload.target, pp, tg)


async def _both(workload: Workload) -> tuple[tuple[RequestResult, ...], tuple[RequestResult, ...]]:
    cfg = workload.config
    client = Client(Endpoint.parse(cfg.url), cfg.timeout_s)
    counter = itertools.count()
    try:
        pp = await _repeat(client, workload, counter, prompt=cfg.prompt, gen=1)
        tg = await _repeat(client, workload, counter, prompt=1, gen=cfg.gen)
    finally:
        client.close()
    return pp, tg


async def _repeat(
    client: Client, workload: Workload, counter: itertools.count[int], prompt: int, gen: int
) -> tuple[RequestResult, ...]:
    payload = workload.payload_fn(gen=gen, prompt=prompt)
    reps = workload.config.repetitions
    warm = max(1, workload.config.warmup or 1)
    await drive(client, payload, itertools.islice(counter, warm), Shape(1, requests=warm))
    driven = await drive(client, payload, itertools.islice(counter, reps), Shape(1, requests=reps))
    return tuple(measure(raw, Expected(prompt, gen)) for raw in driven.raws)


def _pm(d: Dist) -> str:
    if d.mean is None:
        return "-"
    return f"{d.mean:,.2f} ± {d.std or 0.0:,.2f}"


def format_pptg(report: PpTgReport) -> Table:
    cfg = report.config
    table = Table(title=f"plan {report.target.plan}  {cfg.repetitions} repetitions")
    for head in ("model", "test", "t/s", "TTFT ms (mean)"):
        table.add_column(head, justify="right")
    ttft = dist([r.ttft_s for r in report.pp if r.ok and r.ttft_s])
    ttft_ms = "-" if ttft.mean is None else f"{ttft.mean * 1000:.1f}"
    table.add_row(report.target.model, f"pp{cfg.prompt}", _pm(report.pp_rate), ttft_ms)
    table.add_row(report.target.model, f"tg{cfg.gen}", _pm(report.tg_rate), "")
    return table


def pptg_dict(report: PpTgReport) -> dict[str, Any]:
    from dataclasses import asdict

    cfg = report.config
    config = cfg.public()
    config.update(model=report.target.model, plan=report.target.plan, mode="pptg")
    rows = [
        {"test": test, **request_measures(r), "error": r.error}
        for test, results in ((f"pp{cfg.prompt}", report.pp), (f"tg{cfg.gen}", report.tg))
        for r in results
    ]
    return {
        "config": config,
        "pptg": {f"pp{cfg.prompt}": asdict(report.pp_rate), f"tg{cfg.gen}": asdict(report.tg_rate)},
        "requests": rows,
    }
