"""Kernel tables for several model shapes on a lent GPU, in one call (issue 22).

Here (CPU machine, where the project's model reader runs), write the shapes:

    python benchmarks/gpu/kernel_table.py shapes --out benchmarks/gpu/kernel_shapes.json

There (GPU machine: torch, no vLLM needed; launcher.probe.kernels uses only the standard
library and torch), time every shape and write the tables:

    python benchmarks/gpu/kernel_table.py time --shapes benchmarks/gpu/kernel_shapes.json \
        --out $OUT/kernel_tables.json

Back here, compare what the tables predict with the figures measured on the H200 before
(docs/planner.md):

    python benchmarks/gpu/kernel_table.py compare --tables DIR/kernel_tables.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher.probe.kernels import (
    Budget,
    TableKey,
    shape_from_json,
    table_from_json,
    table_to_json,
    time_table,
)

MODELS = Path(__file__).resolve().parent / "models"
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "models"
# (name, model folder, tp)
CASES = (
    ("llama-3.1-8b", FIXTURES / "llama-3.1-8b", 1),
    ("qwen3-30b-a3b", MODELS / "qwen3-30b-a3b-shape", 1),
    ("qwen2.5-32b", MODELS / "qwen2.5-32b-shape", 1),
    ("qwen2.5-32b-tp2", MODELS / "qwen2.5-32b-shape", 2),
    ("llama-3.3-70b-tp2", MODELS / "llama-3.3-70b-shape", 2),
    ("deepseek-v2-lite", MODELS / "deepseek-v2-lite-shape", 1),
    ("gemma-3-27b", MODELS / "gemma-3-27b-shape", 1),
    ("qwen2.5-32b-awq", MODELS / "qwen2.5-32b-awq-shape", 1),
)
# Measured through toposerve + loadgen on one/two H200s, vLLM 0.26 (docs/planner.md, the
# aiconfigurator table): prefill tok/s of a 512-token prompt, single-stream decode tok/s,
# 32-stream generated tok/s (512 -> 256).
MEASURED = {
    "llama-3.1-8b": (17_648, 217, 4_460),
    "qwen3-30b-a3b": (5_097, 251, 1_638),
    "qwen2.5-32b": (8_587, 56, 1_239),
    "qwen2.5-32b-tp2": (12_077, 89, 1_998),
    "llama-3.3-70b-tp2": (6_624, 49, 1_150),
}


def write_shapes(out: Path) -> None:
    from dataclasses import asdict

    from launcher.model.modelspec import load_model_spec
    from launcher.planner.kernelcost import step_shape

    shapes = {name: asdict(step_shape(load_model_spec(str(path)), tp)) for name, path, tp in CASES}
    out.write_text(json.dumps(shapes, indent=1))
    print(f"{len(shapes)} shapes -> {out}")


def time_all(shapes_file: Path, out: Path) -> None:
    import torch

    raw = json.loads(shapes_file.read_text())
    name = torch.cuda.get_device_name(0)
    driver = f"cuda {torch.version.cuda}"
    tables: dict[str, Any] = {}
    for case, shape_raw in raw.items():
        shape = shape_from_json(shape_raw)
        key = TableKey(name, driver, "none", torch.__version__, shape.key())
        t0 = time.perf_counter()
        table = time_table(shape, key, torch=torch, device="cuda",
                           budget=Budget(min_s=0.01, max_reps=100, rounds=3))
        tables[case] = table_to_json(table)
        print(f"{case}: {len(table.times)} timings in {time.perf_counter() - t0:.1f} s", flush=True)
        torch.cuda.empty_cache()
        out.write_text(json.dumps(tables))


def compare(tables_file: Path) -> None:
    from launcher.planner.kernelcost import AllReduce, predict, step_cost
    from launcher.planner.schedsim import SchedulerLimits

    tables = {k: table_from_json(v) for k, v in json.loads(tables_file.read_text()).items()}
    lim = SchedulerLimits(8192, 1024, kv_blocks=200_000)
    # the pair's all-reduce as probe --measure read it (docs/planner.md): 14.4 us, 261 GB/s
    nvlink = AllReduce(2, 14.4e-6, 261e9)
    print("| case | figure | measured | kernel table | error |")
    print("| --- | --- | ---: | ---: | ---: |")
    for case, table in tables.items():
        ar = nvlink if case.endswith("tp2") else AllReduce()
        # the measured runs captured CUDA graphs up to 64 tokens (docs/benchmarks.md)
        kc = step_cost(table, allreduce=ar, assumed_step_overhead_s=1e-3, max_graph_tokens=64)
        p = predict(kc.cost, lim, prompt=512, gen=256, concurrency=32, request_overhead_s=3e-3)
        got = (p.prefill_tok_s, p.decode_tok_s, p.throughput_tok_s)
        meas = MEASURED.get(case)
        for i, fig in enumerate(("prefill tok/s", "decode tok/s", "32-stream tok/s")):
            m = f"{meas[i]:,}" if meas else "not measured"
            err = f"{(got[i] / meas[i] - 1) * 100:+.0f}%" if meas else ""
            print(f"| {case} | {fig} | {m} | {got[i]:,.0f} | {err} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("shapes")
    s.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("time")
    t.add_argument("--shapes", type=Path, required=True)
    t.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare")
    c.add_argument("--tables", type=Path, required=True)
    args = p.parse_args()
    if args.what == "shapes":
        write_shapes(args.out)
    elif args.what == "time":
        time_all(args.shapes, args.out)
    else:
        compare(args.tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
