"""Issue 22: does a per-kernel count explain the spread of the recorded 512-token prefills?

For every recorded single-stream 512-token prefill on one H200 (benchmarks/gpu/results/*/
*/single.json, CUDA graphs captured only to 64 tokens, so the prompt ran eagerly), this prints
the run's time to first token (p50 and the fastest of its requests), the time per layer that
leaves after the roofline's own fixed terms (the request's way in and out,
costmodel.request_host_s, and the engine core's STEP_OVERHEAD_S), the roofline's GPU time per
layer (arithmetic or weights, attention, EAGER_LAYER_S) and its host floor per layer
(costmodel.eager_host_layer_s), which of the two the roofline takes, and the kernels a layer of
the family launches (families.eager_layer_kernels, counted from vLLM's own model code by
launcher/probe/layerops.py). Read-only over the records; nothing is fitted here.

    .venv/bin/python benchmarks/eager_layer_spread.py
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.model import families
from launcher.model.modelspec import ModelSpec, load_model_spec
from launcher.planner import costmodel
from launcher.planner.hardware import EAGER_LAYER_S, SERVER_HOST, STEP_OVERHEAD_S
from launcher.probe.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "gpu" / "results"
MODELS = ROOT / "benchmarks" / "gpu" / "models"
H200 = ROOT / "tests" / "fixtures" / "topologies" / "h200x2-nvlink.nvml.json"
PROMPT = 512
# the one-GPU runs past the graphs (the '-default' folders ran vLLM's default graphs to 512:
# not eager; the two-GPU runs of session 2 have all-reduces or hops in every layer)
SKIP = ("-default", "h200x2")


def gpu_layer_s(m: ModelSpec, lay: costmodel.Layout, tokens: int) -> float:
    """The roofline's GPU time a layer of an eager prefill step (costmodel.prefill_step_s's
    arithmetic-or-weights and attention, over the layers, with EAGER_LAYER_S)."""
    gpus = [g for stage in lay.stages for g in stage]
    attn = costmodel.attention_s(m, lay, costmodel.attention_work(m, tokens, 0))
    compute = costmodel.forward_flops(m, tokens, 1) / costmodel._prefill_flops_s(gpus)
    memory = (costmodel.streamed_weight_bytes(m, tokens)
              / costmodel.weight_stream_efficiency(m, tokens, gpus) / costmodel._mem_bytes_s(gpus))
    return (max(compute, memory) + attn) / m.num_layers + EAGER_LAYER_S


def one_gpu_layout() -> costmodel.Layout:
    gpu = load_topology(str(H200), {}).gpus[0]
    return costmodel.Layout(1, 1, 1, ((gpu,),), costmodel.NO_LINK, costmodel.NO_LINK, 1e12)


def main() -> None:
    lay = one_gpu_layout()
    rows = []
    for path in sorted(RESULTS.glob("*/*/single.json")):
        if any(s in str(path) for s in SKIP):
            continue
        d = json.loads(path.read_text())
        if d["config"]["prompt"] != PROMPT or "tp=1,pp=1" not in (d["config"].get("plan") or ""):
            continue
        m = load_model_spec(str(MODELS / d["config"]["model"]))
        ttft = d["summary"]["ttft_s"]
        fixed = costmodel.request_host_s(SERVER_HOST, PROMPT) + STEP_OVERHEAD_S
        gpu = gpu_layer_s(m, lay, PROMPT)
        host = costmodel.eager_host_layer_s(m, SERVER_HOST)
        predicted = m.num_layers * max(gpu, host) + fixed
        rows.append((path.parent.relative_to(RESULTS), m, ttft, fixed, gpu, host, predicted))
    print(f"{'run':34} {'family':8} {'L':>3} {'kern':>4} {'ttft p50':>8} {'min':>6} "
          f"{'meas/L':>6} {'min/L':>6} {'gpu/L':>6} {'host/L':>6} {'bound':5} {'pred':>6} "
          f"{'err p50':>7} {'err min':>7}")
    for run, m, ttft, fixed, gpu, host, predicted in rows:
        per = (ttft["p50"] - fixed) / m.num_layers
        per_min = (ttft["min"] - fixed) / m.num_layers
        kernels = families.eager_layer_kernels(m.family)
        # error as the table gives it: prefill tok/s predicted over measured
        print(f"{run!s:34} {m.family:8} {m.num_layers:3d} {kernels:4d} "
              f"{ttft['p50'] * 1e3:8.1f} {ttft['min'] * 1e3:6.1f} {per * 1e3:6.3f} "
              f"{per_min * 1e3:6.3f} {gpu * 1e3:6.3f} {host * 1e3:6.3f} "
              f"{'host' if host >= gpu else 'gpu':5} {predicted * 1e3:6.1f} "
              f"{ttft['p50'] / predicted - 1:+7.0%} {ttft['min'] / predicted - 1:+7.0%}")
    errs = [abs(t["p50"] / p - 1) for _, _, t, _, _, _, p in rows]
    errs_min = [abs(t["min"] / p - 1) for _, _, t, _, _, _, p in rows]
    print(f"mean |error| over {len(rows)} runs: p50 {sum(errs) / len(errs):.1%}, "
          f"fastest request {sum(errs_min) / len(errs_min):.1%}")
    # the spread a per-family count cannot move: host-bound runs of one kernel count
    by_count: dict[int, list[float]] = {}
    for _, m, t, fixed, gpu, host, _ in rows:
        if host >= gpu and not m.num_experts:
            by_count.setdefault(families.eager_layer_kernels(m.family), []).append(
                (t["min"] - fixed) / m.num_layers)
    for k, per in sorted(by_count.items()):
        print(f"host-bound dense runs with {k} kernels a layer: fastest request's time a layer "
              f"{min(per) * 1e3:.3f}-{max(per) * 1e3:.3f} ms ({len(per)} runs)")


if __name__ == "__main__":
    main()
