"""The GPU table as Markdown, from the loadgen JSON files run_config.sh left behind.

    python benchmarks/gpu/table.py benchmarks/gpu/results/2026-11-30-h200x2-session2

One row per configuration folder and scenario (single, long, c8, c32, direct*/proxy*), the
NCCL transports the engine's log showed, and the proxy's cost where direct/proxy pairs exist.
Every figure is read from a file; nothing is filled in.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

SCENARIOS = ("single", "long", "c8", "c32")


def _p50(summary: dict[str, Any], key: str) -> float | None:
    block = summary.get(key)
    return None if not block else float(block["p50"])


def row(config: str, scenario: str, data: dict[str, Any]) -> str:
    s = data["summary"]
    c = data["config"]
    ttft = _p50(s, "ttft_s")
    itl = _p50(s, "itl_s")
    prefill = _p50(s, "prefill_tok_s")
    decode = _p50(s, "decode_tok_s")

    def f(v: float | None, scale: float = 1.0, fmt: str = "{:,.1f}") -> str:
        return "–" if v is None else fmt.format(v * scale)

    return (
        f"| {config} | {scenario} | {c['prompt']}→{c['gen']} | {c['concurrency']} "
        f"| {s['requests_ok']}/{s['requests_ok'] + s['requests_failed']} "
        f"| {f(ttft, 1e3)} | {f(prefill, fmt='{:,.0f}')} | {f(decode)} | {f(itl, 1e3)} "
        f"| {f(s.get('output_tok_s'), fmt='{:,.0f}')} |"
    )


def transports(folder: Path) -> str:
    nccl = folder / "nccl.txt"
    if not nccl.exists():
        return "(log not kept)"
    lines = [" ".join(line.split()[1:]) for line in nccl.read_text().splitlines() if line.strip()]
    return ", ".join(sorted(set(lines))) or "none (one GPU)"


def proxy_cost(folder: Path) -> str | None:
    direct = [json.loads(p.read_text()) for p in sorted(folder.glob("direct*.json"))]
    proxied = [json.loads(p.read_text()) for p in sorted(folder.glob("proxy*.json"))]
    if not direct or not proxied:
        return None

    def med(runs: list[dict[str, Any]], key: str) -> float:
        return statistics.median(float(r["summary"][key]) for r in runs)

    def med_p50(runs: list[dict[str, Any]], key: str) -> float:
        return statistics.median(float(r["summary"][key]["p50"]) for r in runs)

    d_tp, p_tp = med(direct, "output_tok_s"), med(proxied, "output_tok_s")
    d_ttft, p_ttft = med_p50(direct, "ttft_s"), med_p50(proxied, "ttft_s")
    d_itl, p_itl = med_p50(direct, "itl_s"), med_p50(proxied, "itl_s")
    return (
        f"{folder.name}: {len(direct)} direct / {len(proxied)} proxied runs, medians: "
        f"output {d_tp:,.0f} vs {p_tp:,.0f} tok/s (proxy keeps {p_tp / d_tp:.1%}), "
        f"TTFT p50 {d_ttft * 1e3:.1f} vs {p_ttft * 1e3:.1f} ms "
        f"({(p_ttft - d_ttft) * 1e3:+.1f} ms), "
        f"ITL p50 {d_itl * 1e3:.2f} vs {p_itl * 1e3:.2f} ms"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: table.py RESULTS_DIR (a folder of run_config.sh outputs)", file=sys.stderr)
        return 2
    root = Path(argv[0])
    print(
        "| config | scenario | tokens | conc. | ok | TTFT p50 ms | prefill tok/s p50 "
        "| decode tok/s p50 | ITL p50 ms | output tok/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    for folder in folders:
        for scenario in SCENARIOS:
            path = folder / f"{scenario}.json"
            if path.exists():
                print(row(folder.name, scenario, json.loads(path.read_text())))
    print()
    for folder in folders:
        print(f"- {folder.name}: NCCL {transports(folder)}")
    for folder in folders:
        cost = proxy_cost(folder)
        if cost:
            print(f"- proxy cost, {cost}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
