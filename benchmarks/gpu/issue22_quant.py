"""4-bit GEMMs (issue 22): the line through Machete's timed GEMMs, and every saved H200 AWQ
record replayed with the planner's 4-bit constants as shipped, with another pair, or with the
shape's kernel table.

    python benchmarks/gpu/issue22_quant.py fit KERNELS_DIR [--kernel-us 5.56] [--gbs 3974]
    python benchmarks/gpu/issue22_quant.py replay VARIANT... [--tables KERNELS_DIR]
        [--topology FILE]

KERNELS_DIR: `probe --measure --model` tables (e.g. the 2026-12-03-h200-split kernels.tgz
unpacked). ``fit``: per GEMM, seconds = fixed + bytes / rate by least squares over the tables'
graph-replayed ``linear:*`` ops at 1 and 32 tokens, bytes the 4-bit weights with AWQ's scales and
zeros as ``quantization.read`` counts them; the fixed part less ``--kernel-us`` (the same
machine's probe: a graph kernel's own cost, which the planner charges apart) and the rate as a
share of ``--gbs`` (that probe's bf16 GEMV rate) are the pair ``hardware.QUANT_GEMM_FIXED_S`` /
``QUANT_STREAM_EFFICIENCY`` stand for. ``replay``: VARIANT ``fit`` (the shipped constants),
``pair:FIXED_US:SHARE`` (the two constants replaced), ``table`` (the record's shape planned with
its kernel table, plan_with_table.py's way; records without a table skipped). Plans on the saved
H200 NVML reading as issue22_now.py does, each record's utilisation and CUDA-graph range as it
ran (``--probe GBS:KERNEL_US``: with that reading's decode rate and graph-kernel cost replaced by
another probe's). Agreement on records already made, not validation.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
GPU = ROOT / "benchmarks" / "gpu"
RESULTS = GPU / "results"
TOPOLOGY = RESULTS / "2026-12-01-h200-lead" / "h200-probe.json"
GRAPHS64 = ('{"cudagraph_capture_sizes":[1,2,4,8,16,32,64],'
            '"pass_config":{"fuse_allreduce_rms":false}}')
# every saved AWQ record on the H200: folder, shape, --gpu-memory-utilization, graph range
RECORDS = {
    "awq": ("2026-12-02-h200-table/awq", "qwen2.5-32b-awq-shape", 0.9, GRAPHS64),
    "awq14": ("2026-12-02-h200-table3/awq14", "qwen2.5-14b-awq-shape", 0.3, GRAPHS64),
    "awq14-default": ("2026-12-02-h200-table3/awq14-default", "qwen2.5-14b-awq-shape", 0.3, "{}"),
    "awq8b": ("2026-12-03-h200-table4/awq8b", "llama-3.1-8b-awq-shape", 0.3, GRAPHS64),
    "awq70": ("2026-12-03-h200-table5/awq70", "llama-3.3-70b-awq-shape", 0.5, "{}"),
}
SCENARIOS = {"single": ["--prompt", "512", "--gen", "256", "--concurrency", "1"],
             "c32": ["--prompt", "512", "--gen", "256", "--concurrency", "32"],
             "long16-c1": ["--prompt", "16384", "--gen", "128", "--concurrency", "1"],
             "long16-c4": ["--prompt", "16384", "--gen", "128", "--concurrency", "4"]}


def tables(folder: Path) -> dict[str, Path]:
    """Shape name -> its kernel table in ``folder``."""
    return {json.loads(p.read_text())["shape"]["name"]: p for p in sorted(folder.glob("*.json"))}


def fit(folder: Path, kernel_us: float, gbs: float) -> int:
    from launcher.model import quantization

    points: dict[int, list[tuple[str, float, float]]] = {1: [], 32: []}
    for name, path in tables(folder).items():
        d = json.loads(path.read_text())
        cfg = json.loads((GPU / "models" / name / "config.json").read_text())
        _, bits, extra = quantization.read(cfg, cfg)
        size = {x["name"]: x["k"] * x["n"] * (bits / 8 + extra) for x in d["shape"]["linears"]}
        for t in d["times"]:
            if t["op"].startswith("linear:") and t["tokens"] in points:
                points[t["tokens"]].append((f"{name} {t['op']}", size[t["op"][7:]],
                                            t["seconds"]))
    for label, pts in (("1 token", points[1]), ("32 tokens", points[32]),
                       ("1 and 32 tokens", points[1] + points[32])):
        n = len(pts)
        mx, my = sum(p[1] for p in pts) / n, sum(p[2] for p in pts) / n
        slope = (sum((p[1] - mx) * (p[2] - my) for p in pts)
                 / sum((p[1] - mx) ** 2 for p in pts))
        fixed, rate = my - slope * mx, 1 / slope
        print(f"{label}: {n} GEMMs on {fixed * 1e6:.2f} us + bytes / {rate / 1e9:,.0f} GB/s: "
              f"QUANT_GEMM_FIXED_S {fixed * 1e6 - kernel_us:.2f} us, "
              f"QUANT_STREAM_EFFICIENCY {rate / 1e9 / gbs:.3f}")
        for what, b, s in pts:
            print(f"    {what}: {b / 1e6:.1f} MB {s * 1e6:.1f} us "
                  f"(line {(fixed + b / rate - s) / s:+.1%})")
    return 0


def plan(variant: str, args: list[str]) -> int:
    """`launcher plan ARGS` with VARIANT's 4-bit constants or kernel table."""
    from launcher.cli.main import main
    from launcher.planner import costmodel

    if variant.startswith("pair:"):
        _, fixed_us, share = variant.split(":")
        # costmodel reads both by name at call time: the pair replaces the shipped one
        setattr(costmodel, "QUANT_GEMM_FIXED_S", float(fixed_us) * 1e-6)  # noqa: B010
        setattr(costmodel, "QUANT_STREAM_EFFICIENCY", float(share))  # noqa: B010
    if variant.startswith("table:"):
        sys.path.insert(0, str(GPU))
        import plan_with_table

        return plan_with_table.run([variant[6:], *args])
    return main(["plan", *args])


def summary(path: Path) -> dict[str, Any]:
    d = json.loads(path.read_text())
    s: dict[str, Any] = d["summary"] if "summary" in d else d["runs"][0]["summary"]
    return s


def figures(scen: str, s: dict[str, Any]) -> dict[str, float]:
    """The record's figures (loadgen's summary) or the plan's (its 'predicted')."""
    if "decode_tok_s" in s and isinstance(s["decode_tok_s"], (int, float)):  # a plan
        ttft = s.get("ttft_p50_s", s["ttft_s"])
        return {"single": {"prefill tok/s": s["prefill_tok_s"], "decode tok/s": s["decode_tok_s"]},
                "c32": {"32-stream tok/s": s["throughput_tok_s"], "32-stream TTFT s": ttft}
                }.get(scen, {f"16k TTFT s {scen[-2:]}": ttft,
                             f"16k output tok/s {scen[-2:]}": s["throughput_tok_s"]})
    if scen == "single":
        return {"prefill tok/s": s["prefill_tok_s"]["p50"],
                "decode tok/s": s["decode_tok_s"]["p50"]}
    if scen == "c32":
        return {"32-stream tok/s": s["output_tok_s"], "32-stream TTFT s": s["ttft_s"]["p50"]}
    return {f"16k TTFT s {scen[-2:]}": s["ttft_s"]["p50"],
            f"16k output tok/s {scen[-2:]}": s["output_tok_s"]}


def probe_topology(topology: Path, gbs: float, kernel_us: float) -> Path:
    """``topology`` with its GPU's measured decode rate and graph-kernel cost replaced (another
    machine's `probe --measure` figures: the one that timed the kernel tables)."""
    d = json.loads(topology.read_text())
    for g in d["gpus"]:
        g["measured"].update(decode_gbs=gbs, kernel_s=kernel_us * 1e-6, samples=[])
    out = Path(tempfile.mkdtemp()) / "topology.json"
    out.write_text(json.dumps(d))
    return out


def replay(variants: list[str], kernels: Path | None, topology: Path) -> int:
    by_shape = tables(kernels) if kernels else {}

    def one(job: tuple[str, str, str]) -> dict[str, float] | None:
        variant, rec, scen = job
        _, shape, util, graphs = RECORDS[rec]
        if variant == "table":
            if shape not in by_shape:
                return None
            variant = f"table:{by_shape[shape]}"
        cmd = [sys.executable, __file__, "plan", variant, "--json",
               "--model", str(GPU / "models" / shape), "--topology", str(topology),
               "--tp", "1", "--pp", "1", "--dp", "1", "--gpu-memory-utilization", str(util),
               *SCENARIOS[scen], "--", "--load-format", "dummy", "--compilation-config", graphs]
        got = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
        d = json.loads(got.stdout)
        if variant.startswith("table:") and not any("kernel table" in r for r in d["reasons"]):
            raise SystemExit(f"{rec} {scen}: the plan did not use the kernel table")
        return figures(scen, d["predicted"])

    jobs = [(v, rec, scen) for rec, (folder, *_) in RECORDS.items() for scen in SCENARIOS
            if (RESULTS / folder / f"{scen}.json").exists() for v in variants]
    with ThreadPoolExecutor(2) as pool:
        got = dict(zip(jobs, pool.map(one, jobs), strict=True))
    print("| record | figure | measured | " + " | ".join(variants) + " |")
    print("| --- | --- | ---: |" + " ---: |" * len(variants))
    errors: dict[str, dict[str, list[float]]] = {v: {"all": [], "GEMM": []} for v in variants}
    for rec, (folder, *_) in RECORDS.items():
        for scen in SCENARIOS:
            path = RESULTS / folder / f"{scen}.json"
            if not path.exists():
                continue
            for name, measured in figures(scen, summary(path)).items():
                cells = []
                for v in variants:
                    p = got[(v, rec, scen)]
                    if p is None:
                        cells.append("—")
                        continue
                    e = (p[name] - measured) / measured
                    errors[v]["all"].append(abs(e))
                    if "prefill" not in name and "TTFT" not in name:
                        errors[v]["GEMM"].append(abs(e))
                    cells.append(f"{p[name]:,.3f} ({e:+.1%})" if p[name] < 10
                                 else f"{p[name]:,.1f} ({e:+.1%})")
                mtext = f"{measured:,.3f}" if measured < 10 else f"{measured:,.1f}"
                print(f"| {rec} | {name} | {mtext} | " + " | ".join(cells) + " |")
    for v, errs in errors.items():
        gemm, every = errs["GEMM"], errs["all"]
        print(f"{v}: mean |error| {sum(gemm) / len(gemm):.2%} over {len(gemm)} decode / "
              f"32-stream / 16k-output figures, {sum(every) / len(every):.2%} over all "
              f"{len(every)}")
    return 0


def main() -> int:
    if sys.argv[1:2] == ["plan"]:
        return plan(sys.argv[2], sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit")
    f.add_argument("kernels", type=Path)
    f.add_argument("--kernel-us", type=float, default=5.56)
    f.add_argument("--gbs", type=float, default=3974.0)
    r = sub.add_parser("replay")
    r.add_argument("variants", nargs="+")
    r.add_argument("--tables", type=Path, default=None)
    r.add_argument("--topology", type=Path, default=TOPOLOGY)
    r.add_argument("--probe", default=None, metavar="GBS:KERNEL_US",
                   help="plan with the topology's decode rate and graph-kernel cost replaced")
    a = ap.parse_args()
    if a.cmd == "fit":
        return fit(a.kernels, a.kernel_us, a.gbs)
    topology = a.topology
    if a.probe:
        gbs, kernel_us = (float(x) for x in a.probe.split(":"))
        topology = probe_topology(topology, gbs, kernel_us)
    return replay(a.variants, a.tables, topology)


if __name__ == "__main__":
    sys.exit(main())
