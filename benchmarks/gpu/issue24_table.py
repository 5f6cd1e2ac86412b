"""Issue 24's H200 tables from one results folder of benchmarks/gpu/issue24.sh: the planner's
time to first token at depth (its `launcher plan --json`, made on the machine before the run)
beside what loadgen measured through the proxy, and the agent run per turn with and without KV
offloading.

    python benchmarks/gpu/issue24_table.py benchmarks/gpu/results/2026-12-02-h200
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def _err(pred: float, meas: float) -> str:
    return f"{(pred - meas) / meas * 100:+.0f}%"


def depth_rows(root: Path, run: str, pred: str, name: str) -> list[str]:
    """TTFT p50 at each depth, cached and cold, against the plan's cached / recomputed turn."""
    single = _load(root / pred / "single512.json")["predicted"]["ttft_s"]
    rows = []
    for mode, key in (("cached", "ttft_cached_s"), ("cold", "ttft_recomputed_s")):
        for r in _load(root / run / f"depth-{mode}.json")["runs"]:
            depth = r["depth"]["tokens"]
            s = r["summary"]
            meas = s["ttft_s"]["p50"]
            p = single if depth == 0 else \
                _load(root / pred / f"depth{depth}.json")["agent"]["rooms"][0][key]
            rows.append(f"| {name} | {depth:,} | {mode} | {p * 1000:,.1f} | {meas * 1000:,.1f} "
                        f"| {_err(p, meas)} | {r['depth']['hit_rate'] * 100:.0f}% "
                        f"| {s['decode_tok_s']['p50']:.1f} |")
    return rows


AGENT_RUNS = (("agent09", "agent-lone"), ("agent09", "agent-4"), ("depth8b", "agent-gpu-only"),
              ("offload8b", "agent-offload"))


def agent_rows(root: Path) -> list[str]:
    """Per turn: TTFT p50 and cache hit of each agent run that is there, beside the plan's TTFT
    of a lone session's turn at that depth (its prefix cached)."""
    runs = [_load(root / d / f"{k}.json")["agent"]["per_turn"] for d, k in AGENT_RUNS
            if (root / d / f"{k}.json").exists()]
    rows = []
    for i, t in enumerate(runs[0]):
        depth = int(t["prompt_tokens"]["mean"] - t["new_tokens"]["mean"])
        pred_file = root / "predict" / f"turn{round(depth / 1000) * 1000}.json"
        pred = (_load(pred_file)["agent"]["rooms"][0]["ttft_cached_s"] * 1000
                if pred_file.exists() else None)
        cells = [f"{t['turn']}", f"{t['prompt_tokens']['mean']:,.0f}",
                 f"{t['new_tokens']['mean']:,.0f}", "-" if pred is None else f"{pred:,.1f}"]
        for run in runs:
            r = run[i]
            ttft = r["ttft_s"]["p50"] * 1000
            err = "" if pred is None else f" ({_err(pred / 1000, ttft / 1000)})"
            cells += [f"{ttft:,.1f}{err}", f"{r['cache_hit_rate'] * 100:.0f}%"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def main(root: Path) -> None:
    print("| model | depth | context | predicted TTFT ms | measured TTFT p50 ms | error "
          "| hit (usage) | decode tok/s p50 |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for line in depth_rows(root, "depth8b", "predict", "Llama-3.1-8B shape"):
        print(line)
    if (root / "depth32b").exists():
        for line in depth_rows(root, "depth32b", "predict32b", "Qwen2.5-32B shape"):
            print(line)
    print()
    heads = [f"{d}/{k}: TTFT p50 ms (plan's error) | hit" for d, k in AGENT_RUNS
             if (root / d / f"{k}.json").exists()]
    print("| turn | prompt tok | new tok | plan: lone turn, cached (ms) | " + " | ".join(heads)
          + " |")
    print("| ---: " * (4 + 2 * len(heads)) + "|")
    for line in agent_rows(root):
        print(line)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
