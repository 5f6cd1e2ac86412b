"""Measure the cost model's efficiency factors on the GPU at hand, for one model's shapes.

The cost model (launcher/planner/costmodel.py) assumes a fraction of each card's datasheet peak:
MFU for
a 512-token prefill, MFU for batched decode, and the share of memory bandwidth a decode GEMV
streams at. This times the very GEMMs of one transformer layer of a model at a TP degree (bf16,
torch.matmul = cuBLAS, as vLLM's unquantized linear layers use) and prints the achieved
fractions against the row of launcher/planner/hardware.py for this GPU:

    python benchmarks/planner_kernels.py --model tests/fixtures/models/llama-3.3-70b --tp 2

Kernel-level figures: attention, norms, sampling and the engine's own overhead come on top, so
they bound the end-to-end efficiency from above; issue 7 compares with vLLM itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.model.modelspec import load_model_spec
from launcher.planner import hardware


def layer_shapes(m: Any, tp: int) -> list[tuple[int, int]]:
    """(in, out) of the four GEMMs of one layer on one TP rank: QKV, O, gate+up, down."""
    d, h = m.head_dim, m.hidden_size
    qkv = (m.num_heads + 2 * m.num_kv_heads) * d // tp
    return [
        (h, qkv),
        (m.num_heads * d // tp, h),
        (h, 2 * m.intermediate_size // tp),
        (m.intermediate_size // tp, h),
    ]


def time_layer(torch: Any, shapes: list[tuple[int, int]], tokens: int, reps: int) -> float:
    """Seconds for one layer's GEMMs at ``tokens`` rows; many layers' weights cycle so that the
    decode case streams from HBM instead of hitting L2."""
    copies = 8
    ws = [
        [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for k, n in shapes]
        for _ in range(copies)
    ]
    xs = {k: torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16) for k, _ in shapes}
    for w in ws[0]:
        torch.matmul(xs[w.shape[0]], w)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for r in range(reps):
        for w in ws[r % copies]:
            torch.matmul(xs[w.shape[0]], w)
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / 1e3 / reps


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="tests/fixtures/models/llama-3.3-70b")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args()
    import torch

    m = load_model_spec(args.model)
    name = torch.cuda.get_device_name(0)
    row = hardware.gpu_model(name, torch.cuda.get_device_capability(0))
    shapes = layer_shapes(m, args.tp)
    weight_bytes = sum(k * n * 2 for k, n in shapes)
    out: dict[str, Any] = {
        "gpu": name,
        "table_row": row.key,
        "model": m.name,
        "tp": args.tp,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "rows": [],
    }
    for tokens in (1, 8, 32, 128, 512, 2048):
        t = time_layer(torch, shapes, tokens, args.reps)
        flops = 2 * tokens * weight_bytes / 2
        moved = weight_bytes + sum(tokens * (k + n) * 2 for k, n in shapes)
        out["rows"].append(
            {
                "tokens": tokens,
                "layer_us": round(t * 1e6, 1),
                "tflops": round(flops / t / 1e12, 1),
                "mfu": round(flops / t / (row.bf16_tflops * 1e12), 3),
                "gbs": round(moved / t / 1e9),
                "mem_efficiency": round(moved / t / (row.mem_bw_gbs * 1e9), 3),
            }
        )
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
