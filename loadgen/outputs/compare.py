"""`loadgen compare A.json B.json`: the same measures side by side, with B/A ratios (pure core)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from loadgen.errors import BadArgument
from topocommon import jsontext

# (label, path into summary, higher is better)
ROWS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("TTFT p50 s", ("ttft_s", "p50"), False),
    ("TTFT p99 s", ("ttft_s", "p99"), False),
    ("prefill tok/s p50", ("prefill_tok_s", "p50"), True),
    ("decode tok/s p50", ("decode_tok_s", "p50"), True),
    ("ITL p50 s", ("itl_s", "p50"), False),
    ("ITL p99 s", ("itl_s", "p99"), False),
    ("e2e p50 s", ("e2e_s", "p50"), False),
    ("output tok/s", ("output_tok_s",), True),
    ("total tok/s", ("total_tok_s",), True),
    ("requests ok", ("requests_ok",), True),
    ("requests failed", ("requests_failed",), False),
)


def load(path: Path) -> dict[str, Any]:
    try:
        data = jsontext.loads(path.read_text())
    except OSError as exc:
        raise BadArgument(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise BadArgument(f"{path} is not JSON: give files written by `loadgen --json`") from None
    if not isinstance(data, dict) or not ("summary" in data or "runs" in data):
        raise BadArgument(f"{path} is not a loadgen --json result (no summary or runs)")
    runs = data.get("runs", [data])
    if not isinstance(runs, list) or not all(_is_run(r) for r in runs):
        raise BadArgument(f"{path} is not a loadgen --json result (a run without its config and "
                          "summary objects, or its concurrency not a number)")
    return data


def _is_run(run: object) -> bool:
    # what runs_by_concurrency reads of each run: config.concurrency (a dict key) and summary
    if not isinstance(run, dict):
        return False
    config, summary = run.get("config"), run.get("summary")
    concurrency = config.get("concurrency") if isinstance(config, dict) else []
    return (isinstance(summary, dict) and isinstance(concurrency, (int, float, str, type(None))))


def runs_by_concurrency(data: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    runs = data.get("runs", [data])
    return {run["config"].get("concurrency"): run["summary"] for run in runs}


def _get(summary: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = summary
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def ratio(a: float | None, b: float | None) -> float | None:
    return b / a if a not in (None, 0) and b is not None else None


def comparison(
    a: dict[str, Any], b: dict[str, Any]
) -> list[tuple[Any, str, float | None, float | None, float | None, bool]]:
    """Rows (concurrency, measure, A, B, B/A, higher is better) for levels both files have."""
    runs_a, runs_b = runs_by_concurrency(a), runs_by_concurrency(b)
    common = [c for c in runs_a if c in runs_b]
    if not common:
        raise BadArgument("the two files share no concurrency level to compare")
    rows = []
    for conc in common:
        for label, path, higher in ROWS:
            va, vb = _get(runs_a[conc], path), _get(runs_b[conc], path)
            rows.append((conc, label, va, vb, ratio(va, vb), higher))
    return rows


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.4f}" if abs(v) < 10 else f"{v:,.1f}"


def format_comparison(a: dict[str, Any], b: dict[str, Any], name_a: str, name_b: str) -> Table:
    table = Table(title=f"B/A: {name_b} against {name_a}")
    for head in ("conc", "measure", "A", "B", "B/A"):
        table.add_column(head, justify="right")
    for conc, label, va, vb, r, higher in comparison(a, b):
        better = r is not None and r != 1 and (r > 1) == higher
        shown = "-" if r is None else f"[{'green' if better else 'red'}]{r:.3f}×[/]"
        table.add_row(str(conc), label, _fmt(va), _fmt(vb), shown if r != 1 else "1.000×")
    return table
