"""toposerve's planner beside NVIDIA's aiconfigurator on the cases measured on the lent H200s.

    python benchmarks/gpu/aic_compare.py --aic /tmp/aic/bin/aiconfigurator

aiconfigurator (PyPI, in a venv of its own: never in the project's .venv) is asked for
``estimate --backend vllm --system h200_sxm --isl 512 --osl 256`` at batch 1 and 32 with the
same TP; its TTFT gives prefill tok/s (512 / TTFT), its TPOT at batch 1 the decode tok/s and
its tokens/s at batch 32 the 32-stream throughput. toposerve's figures are `plan`'s for the
same model shape on the H200 topology. Measured figures are the loadgen p50s kept in
benchmarks/gpu/results/. A case aiconfigurator cannot estimate prints its error.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from launcher.model.modelspec import load_model_spec  # noqa: E402
from launcher.planner.plan import Policy, plan  # noqa: E402
from launcher.probe.topology import load_topology  # noqa: E402

MODELS = REPO / "benchmarks/gpu/models"
TOPO = REPO / "tests/fixtures/topologies/h200x2-nvlink.nvml.json"
R14 = REPO / "benchmarks/gpu/results/2026-12-01-h200-issue14"
R2 = REPO / "benchmarks/gpu/results/2026-11-30-h200x2-session2"
# case -> (model shape, tp, gemm quant for aiconfigurator, folder of the measurement)
CASES = {
    "Llama-3.1-8B, 1 GPU": ("llama-3.1-8b-longctx-shape", 1, "bfloat16", R14 / "dense"),
    "Qwen3-30B-A3B, 1 GPU": ("qwen3-30b-a3b-shape", 1, "bfloat16", R14 / "moe"),
    "Gemma-3-27B, 1 GPU": ("gemma-3-27b-shape", 1, "bfloat16", None),
    "Qwen2.5-32B AWQ, 1 GPU": ("qwen2.5-32b-awq-shape", 1, "int4_wo", None),
    "Qwen2.5-32B, 1 GPU": ("qwen2.5-32b-shape", 1, "bfloat16", R2 / "qwen32-tp1"),
    "Qwen2.5-32B, TP=2": ("qwen2.5-32b-shape", 2, "bfloat16", R2 / "qwen32-tp2"),
    "Llama-3.3-70B, TP=2": ("llama-3.3-70b-shape", 2, "bfloat16", R2 / "tp2-nvlink"),
}


def aic(exe: str, model: str, tp: int, quant: str | None, batch: int, isl: int = 512,
        osl: int = 256, system: str = "h200_sxm") -> dict[str, float] | str:
    """aiconfigurator's TTFT, TPOT (ms) and tokens/s for ``batch`` requests of ``isl`` -> ``osl``
    (``quant`` None: its own reading of the config), or the line saying why it cannot."""
    cmd = [exe, "cli", "estimate", "--model-path", str(MODELS / model), "--system", system,
           "--backend", "vllm", "--isl", str(isl), "--osl", str(osl), "--batch-size", str(batch),
           "--tp-size", str(tp), "--estimate-mode", "agg"]
    if quant is not None:
        cmd += ["--gemm-quant-mode", quant]
    if "a3b" in model:  # a mixture-of-experts: experts split as the attention is
        cmd += ["--moe-tp-size", str(tp), "--moe-ep-size", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    text = out.stdout + out.stderr
    fields = {}
    for key, pat in (("ttft_ms", r"TTFT:\s+([0-9.]+) ms"), ("tpot_ms", r"TPOT:\s+([0-9.]+) ms"),
                     ("tok_s", r"\n\s+tokens/s:\s+([0-9.,]+)")):
        m = re.search(pat, text)
        if m:
            fields[key] = float(m.group(1).replace(",", ""))
    if len(fields) < 3:
        errs = [ln for ln in text.splitlines() if "[E]" in ln or "Error" in ln]
        return (errs[-1] if errs else text.strip().splitlines()[-1])[:200]
    return fields


def measured(folder: Path | None) -> dict[str, float]:
    if folder is None:
        return {}
    out = {}
    single, c32 = folder / "single.json", folder / "c32.json"
    if single.exists():
        s = json.loads(single.read_text())["summary"]
        out |= {"prefill": s["prefill_tok_s"]["p50"], "decode": s["decode_tok_s"]["p50"]}
    elif (folder / "loadgen.txt").exists():  # tp2-nvlink's single.json did not come back
        first = (folder / "loadgen.txt").read_text().split("concurrency 1:")[0]
        for key, row in (("prefill", "prefill tok/s"), ("decode", "decode tok/s")):
            line = next(x for x in first.splitlines() if x.strip("│ ").startswith(row))
            out[key] = float([c for c in line.split("│") if c.strip()][2].replace(",", ""))
    if c32.exists():
        out["c32"] = json.loads(c32.read_text())["summary"]["output_tok_s"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aic", default="/tmp/aic/bin/aiconfigurator")
    args = ap.parse_args()
    topo = load_topology(str(TOPO), {})
    print("| case | figure | measured | toposerve | aiconfigurator |")
    print("| --- | --- | ---: | ---: | ---: |")
    for case, (model, tp, quant, folder) in CASES.items():
        m = load_model_spec(str(MODELS / model))
        ours = {
            c: plan(topo, m, Policy(force_tp=tp, force_pp=1, force_dp=1, concurrency=c)).predicted
            for c in (1, 32)
        }
        b1, b32 = aic(args.aic, model, tp, quant, 1), aic(args.aic, model, tp, quant, 32)
        got = measured(folder)
        rows = {
            "prefill tok/s": (got.get("prefill"), ours[1].prefill_tok_s,
                              512 / b1["ttft_ms"] * 1000 if isinstance(b1, dict) else b1),
            "decode tok/s": (got.get("decode"), ours[1].decode_tok_s,
                             1000 / b1["tpot_ms"] if isinstance(b1, dict) else b1),
            "32-stream tok/s": (got.get("c32"), ours[32].throughput_tok_s,
                                b32["tok_s"] if isinstance(b32, dict) else b32),
        }
        for fig, (meas, top, other) in rows.items():
            def cell(v: float | str | None, ref: float | None = meas) -> str:
                if v is None:
                    return "not measured"
                if isinstance(v, str):
                    return "cannot: " + v.removeprefix("Error: ")[:70]
                return f"{v:,.0f}" + (f" ({v / ref - 1:+.0%})" if ref else "")
            print(f"| {case} | {fig} | {cell(meas, None)} | {cell(top)} | {cell(other)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
