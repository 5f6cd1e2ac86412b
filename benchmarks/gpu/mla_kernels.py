"""Latent attention's kernels side by side on one GPU (issue 22): what `probe --measure --model`
timed for the GLM-4.7-Flash shape until session 22 (torch's SDPA for prompt chunks, vLLM's
Triton MLA decode) beside what vLLM 0.26 ran on the H200 (FlashAttention for the prompt chunks,
FlashAttention MLA for decode), through the harness's own calls (launcher.probe.kernels._Ops),
each timed as the probe times it (eager median and CUDA-graph replay).

    PYTHONPATH=/root/site:$PWD python3 benchmarks/gpu/mla_kernels.py [SHAPE_DIR]

Prints one line per (op, size): microseconds a layer for each kernel, eager and graph-replayed
("--" where a kernel does not run here).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher.model.modelspec import load_model_spec
from launcher.planner.kernelcost import step_shape
from launcher.probe import kernels as K


def main() -> int:
    import torch

    shape_dir = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/gpu/models/glm-4.7-flash-shape"
    a = next(x for x in step_shape(load_model_spec(shape_dir)).attention if x.latent)
    print(f"{shape_dir}: {a}")
    ops = K._Ops(torch, "cuda", "bfloat16")
    budget = K.Budget()

    def us(call: Callable[[], object] | None) -> str:
        if call is None:
            return "      --"
        eager = K._median_call_s(call, ops.sync, budget)
        graphed = K._graph_call_s(torch, call, budget)
        graph = "" if graphed is None else f"{graphed * 1e6:8.1f} graph"
        return f"{eager * 1e6:8.1f} eager {graph}"

    with torch.inference_mode():
        for n, depth in ((512, 0), (2048, 0), (8192, 0), (8192, 8192)):
            sdpa = ops.latent_prefill(a, n, 1) if depth == 0 else None
            print(f"prefill {n} after {depth}: SDPA {us(sdpa)} | FlashAttention "
                  f"{us(ops.flash_prefill(a, n, depth))}", flush=True)
        for seqs, ctx in ((1, 1024), (4, 1024), (4, 8192), (32, 640), (32, 8192)):
            print(f"decode {seqs} x {ctx}: Triton MLA {us(ops._triton_mla_decode(a, ctx, seqs))}"
                  f" | FlashAttention MLA {us(ops._flash_mla_decode(a, ctx, seqs))}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
