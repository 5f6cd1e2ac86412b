"""Issue 22's proof table: measured on the H200, predicted by toposerve before the run, and
estimated by NVIDIA's aiconfigurator on the same config folder.

    python benchmarks/gpu/issue22_table.py RESULTS_DIR [--aic /tmp/aic/bin/aiconfigurator]

RESULTS_DIR holds what `benchmarks/gpu/issue22-table.sh predict CASE...` left: predictions.jsonl
and one folder per case (the `.tgz` unpacked) with loadgen's JSON files. aiconfigurator (PyPI,
in a venv of its own) is asked `cli estimate --backend vllm --system h200_sxm` (`--system`) with
the same input/output lengths and batch; a case it cannot run prints its reason. Every percentage is
against the measurement; the mean absolute error is over the figures both tools gave.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aic_compare  # the same directory: run as `python benchmarks/gpu/issue22_table.py`

# session 24's moonlightd and gemma12d, session 23's mladef, the fresh shapes of sessions 19,
# 18, 17, 16 and 15, then session 12's (issue22-table.sh lists them), then older
MODEL = {"moonlightd": "moonlight-16b-a3b-shape", "gemma12d": "gemma-3-12b-shape",
         "mladef": "deepseek-v2-lite-shape",
         "qwen06": "qwen3-0.6b-shape", "gemma270": "gemma-3-270m-shape",
         "q3awq32": "qwen3-32b-awq-shape", "moe30": "qwen3-30b-a3b-shape",
         "phi4": "phi-4-shape", "qwen15": "qwen2.5-1.5b-shape",
         "qwen17": "qwen3-1.7b-shape", "gemma1b": "gemma-3-1b-shape",
         "granite8": "granite-3.3-8b-shape", "q3awq14": "qwen3-14b-awq-shape",
         "llama2": "llama-2-7b-shape",
         "mlalong": "glm-4.7-flash-shape",
         "awq70": "llama-3.3-70b-awq-shape", "qwen8b": "qwen3-8b-shape",
         "gemma4b": "gemma-3-4b-shape", "qwen3b": "qwen2.5-3b-shape",
         "glm": "glm-4.7-flash-shape", "gemma12": "gemma-3-12b-shape",
         "awq8b": "llama-3.1-8b-awq-shape", "qwen4b": "qwen3-4b-shape",
         "qwen14": "qwen3-14b-shape", "small24": "mistral-small-24b-shape",
         "moonlight": "moonlight-16b-a3b-shape", "smollm2": "smollm2-1.7b-shape",
         "awq14": "qwen2.5-14b-awq-shape", "gemma2": "gemma-2-9b-shape",
         "long14": "qwen2.5-14b-shape", "nemo12": "mistral-nemo-12b-shape",
         "small": "llama-3.2-1b-shape", "qwen7b": "qwen2.5-7b-shape",
         "mla": "deepseek-v2-lite-shape", "awq": "qwen2.5-32b-awq-shape",
         "gemma": "gemma-3-27b-shape", "long8b": "llama-3.1-8b-longctx-shape",
         "qwen3": "qwen3-32b-shape", "small3b": "llama-3.2-3b-shape"}
LABEL = {"moonlightd": "Moonlight-16B-A3B (MLA MoE), default graphs",
         "gemma12d": "Gemma-3-12B (sliding), default graphs",
         "mladef": "DeepSeek-V2-Lite (MLA MoE), default graphs",
         "qwen06": "Qwen3-0.6B", "gemma270": "Gemma-3-270M (sliding)",
         "q3awq32": "Qwen3-32B AWQ (4-bit)", "moe30": "Qwen3-30B-A3B (MoE)",
         "phi4": "Phi-4 (Phi-3 family)", "qwen15": "Qwen2.5-1.5B",
         "qwen17": "Qwen3-1.7B", "gemma1b": "Gemma-3-1B (sliding)",
         "granite8": "Granite-3.3-8B", "q3awq14": "Qwen3-14B AWQ", "llama2": "Llama-2-7B (no GQA)",
         "mlalong": "GLM-4.7-Flash (MLA MoE), new workload",
         "awq70": "Llama-3.3-70B AWQ", "qwen8b": "Qwen3-8B", "gemma4b": "Gemma-3-4B (sliding)",
         "qwen3b": "Qwen2.5-3B",
         "glm": "GLM-4.7-Flash (MLA MoE)", "gemma12": "Gemma-3-12B (sliding)",
         "awq8b": "Llama-3.1-8B AWQ", "qwen4b": "Qwen3-4B", "qwen14": "Qwen3-14B",
         "small24": "Mistral-Small-24B",
         "moonlight": "Moonlight-16B-A3B (MLA MoE)", "smollm2": "SmolLM2-1.7B",
         "awq14": "Qwen2.5-14B AWQ", "gemma2": "Gemma-2-9B (sliding)", "long14": "Qwen2.5-14B",
         "nemo12": "Mistral-Nemo-12B",
         "small": "Llama-3.2-1B", "qwen7b": "Qwen2.5-7B", "mla": "DeepSeek-V2-Lite (MLA MoE)",
         "awq": "Qwen2.5-32B AWQ", "gemma": "Gemma-3-27B (sliding)", "long8b": "Llama-3.1-8B",
         "qwen3": "Qwen3-32B", "small3b": "Llama-3.2-3B"}


@dataclass(frozen=True)
class Figure:
    case: str
    name: str  # what is compared, with its unit
    measured: float | None
    toposerve: float | None
    aic: float | str | None  # a str is aiconfigurator's reason for not estimating
    # the plan's span of this figure between its host timing's sampled pace and its rounds' own
    # (predicted.host_pace_range, where the pace was unsteady), (low, high)
    pace_range: tuple[float, float] | None = None


def pace_range(line: Any, key: str) -> tuple[float, float] | None:
    """``key``'s span in a plan line's host_pace_range ({figure: [low, high]}), None where the
    line has none or it is not two finite numbers, low first."""
    spans = line.get("host_pace_range") if isinstance(line, dict) else None
    got = spans.get(key) if isinstance(spans, dict) else None
    if not isinstance(got, list) or len(got) != 2 or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            for x in got) or got[0] > got[1]:
        return None
    return float(got[0]), float(got[1])


def load_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summary(folder: Path, name: str) -> dict | None:
    d = load_json(folder / f"{name}.json")
    if d is None:
        return None
    return d["summary"] if "summary" in d else d["runs"][0]["summary"]


def depth_ttft(folder: Path, name: str) -> dict[int, float]:
    d = load_json(folder / f"{name}.json")
    if d is None:
        return {}
    return {int(r["depth"]["tokens"]): r["summary"]["ttft_s"]["p50"]
            for r in d["runs"] if r.get("depth")}


def aic(exe: str | None, case: str, isl: int, osl: int, batch: int,
        system: str = "h200_sxm") -> dict[str, float] | str:
    """aiconfigurator's estimate on one GPU (aic_compare.aic), its refusal shortened."""
    if exe is None:
        return "not run"
    got = aic_compare.aic(exe, MODEL[case], 1, None, batch, isl, osl, system)
    return got.split("Supported architectures")[0].strip()[:120] if isinstance(got, str) else got


def figures(results: Path, exe: str | None, predictions: Path | None = None,
            suffix: str = "", system: str = "h200_sxm") -> list[Figure]:
    pred: dict[tuple[str, str], dict] = {}
    for line in (predictions or results / "predictions.jsonl").read_text().splitlines():
        d = json.loads(line)
        pred[(d["case"], d["scenario"])] = d
    out: list[Figure] = []

    def p(case: str, scen: str, key: str) -> float | None:
        d = pred.get((case, scen))
        return None if d is None or key not in d else float(d[key])

    def r(case: str, scen: str, key: str) -> tuple[float, float] | None:
        return pace_range(pred.get((case, scen)), key)

    for case in MODEL:
        folder = results / f"{case}{suffix}"
        if not folder.is_dir():
            continue
        single, c32 = summary(folder, "single"), summary(folder, "c32")
        if single is not None:
            a = aic(exe, case, 512, 256, 1, system)
            out.append(Figure(case, "prefill tok/s (512)", single["prefill_tok_s"]["p50"],
                              p(case, "single", "prefill_tok_s"),
                              a if isinstance(a, str) else 512 / (a["ttft_ms"] / 1000),
                              r(case, "single", "prefill_tok_s")))
            out.append(Figure(case, "decode tok/s", single["decode_tok_s"]["p50"],
                              p(case, "single", "decode_tok_s"),
                              a if isinstance(a, str) else 1000 / a["tpot_ms"],
                              r(case, "single", "decode_tok_s")))
        if c32 is not None:
            a = aic(exe, case, 512, 256, 32, system)
            out.append(Figure(case, "32-stream tok/s", c32["output_tok_s"],
                              p(case, "c32", "throughput_tok_s"),
                              a if isinstance(a, str) else a["tok_s"],
                              r(case, "c32", "throughput_tok_s")))
            # TTFT under load: the plan's simulated scheduler (ttft_p50_s, from 17f7fc5 on)
            if p(case, "c32", "ttft_p50_s") is not None:
                out.append(Figure(case, "32-stream TTFT p50 s", c32["ttft_s"]["p50"],
                                  p(case, "c32", "ttft_p50_s"),
                                  a if isinstance(a, str) else a["ttft_ms"] / 1000,
                                  r(case, "c32", "ttft_p50_s")))
        for n in (1, 4):
            s = summary(folder, f"long16-c{n}")
            if s is None:
                continue
            a = aic(exe, case, 16384, 128, n, system)
            # one request's TTFT (ttft_s) until the plan gave it under load (ttft_p50_s)
            under_load = p(case, f"long16-c{n}", "ttft_p50_s")
            ttft_key = "ttft_p50_s" if under_load is not None else "ttft_s"
            out.append(Figure(case, f"16k TTFT s, {n} at once", s["ttft_s"]["p50"],
                              p(case, f"long16-c{n}", ttft_key),
                              a if isinstance(a, str) else a["ttft_ms"] / 1000,
                              r(case, f"long16-c{n}", ttft_key)))
            out.append(Figure(case, f"16k output tok/s, {n} at once", s["output_tok_s"],
                              p(case, f"long16-c{n}", "throughput_tok_s"),
                              a if isinstance(a, str) else a["tok_s"],
                              r(case, f"long16-c{n}", "throughput_tok_s")))
        for kind, key in (("cached", "ttft_cached_s"), ("cold", "ttft_recomputed_s")):
            for depth, ttft in sorted(depth_ttft(folder, f"depth-{kind}").items()):
                if depth == 0:
                    continue
                room = (pred.get((case, f"depth{depth}")) or {}).get("agent_rooms") or [{}]
                predicted = room[0].get(key)
                out.append(Figure(case, f"TTFT s at depth {depth} ({kind})", ttft,
                                  None if predicted is None else float(predicted),
                                  "no depth input"))
    return out


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.4g}"


def pace_summary(figs: list[Figure]) -> str | None:
    """One line: how many measured figures lie inside their plan's host-pace range (ends
    included), and which do not, with how far past the nearer end; None where no plan gave a
    range."""
    ranged = [f for f in figs if f.pace_range is not None and f.measured]
    if not ranged:
        return None
    outside = []
    for f in ranged:
        assert f.pace_range is not None
        assert f.measured
        low, high = f.pace_range
        if not low <= f.measured <= high:
            end = low if f.measured < low else high
            outside.append(f"{f.case} {f.name} {_num(f.measured)} not in {_num(low)}-"
                           f"{_num(high)} ({(f.measured - end) / end:+.1%} past)")
    return (f"host-pace range: {len(ranged) - len(outside)} of {len(ranged)} measured figures "
            f"inside their plan's span between its host timing's two paces"
            + (f"; outside: {'; '.join(outside)}" if outside else ""))


def err(x: float | str | None, m: float | None) -> str:
    if not isinstance(x, float) or m is None:
        return ""
    return f" ({(x - m) / m:+.0%})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--aic", default=None, help="aiconfigurator executable (its own venv)")
    ap.add_argument("--predictions", type=Path, default=None,
                    help="the plans' JSON lines (default: RESULTS/predictions.jsonl)")
    ap.add_argument("--suffix", default="",
                    help="the measured folders' NAME_SUFFIX (e.g. -default: CASE-default/)")
    ap.add_argument("--system", default="h200_sxm",
                    help="aiconfigurator's system of the GPU that served the table (h100_sxm for "
                         "an H100 SXM)")
    args = ap.parse_args()
    figs = figures(args.results, args.aic, args.predictions, args.suffix, args.system)
    print("| case | figure | measured | toposerve | aiconfigurator |")
    print("| --- | --- | ---: | ---: | ---: |")
    ours, theirs, ours_shared, n10, n15 = [], [], [], 0, 0
    for f in figs:
        def fmt(x: float | str | None) -> str:
            if x is None:
                return "—"
            if isinstance(x, str):
                return f"cannot: {x}" if x != "no depth input" else "—"
            return f"{x:,.3f}" if x < 10 else f"{x:,.0f}"
        print(f"| {LABEL[f.case]} | {f.name} | {fmt(f.measured)} | {fmt(f.toposerve)}"
              f"{err(f.toposerve, f.measured)} | {fmt(f.aic)}{err(f.aic, f.measured)} |")
        if f.measured and f.toposerve is not None:
            e = abs(f.toposerve - f.measured) / f.measured
            ours.append(e)
            n10 += e <= 0.10
            n15 += e <= 0.15
            if isinstance(f.aic, float):
                ours_shared.append(e)
                theirs.append(abs(f.aic - f.measured) / f.measured)
    if ours:
        print(f"\ntoposerve: {len(ours)} figures, mean |error| {sum(ours) / len(ours):.1%}, "
              f"{n10} within 10%, {n15} within 15%")
    if theirs:
        print(f"shared with aiconfigurator ({len(theirs)} figures): toposerve "
              f"{sum(ours_shared) / len(ours_shared):.1%}, aiconfigurator "
              f"{sum(theirs) / len(theirs):.1%}")
    if (paced := pace_summary(figs)) is not None:
        print(paced)
    return 0


if __name__ == "__main__":
    sys.exit(main())
