"""What a single 512-token request's time to first token decomposes into on every saved one-GPU
H200 record, under the plan's cost model at this commit (the shipped host profile), beside two
host-only timings each record holds of its own run's host:

- vLLM's Dynamo bytecode transform (its log: pure Python on the host CPU, growing with the
  layers it traces), in seconds a layer;
- the proxy's access log of loadgen's ``POST /tokenize`` (no GPU work at all: the proxy and
  vLLM's API server tokenising loadgen's prompt text), median ms, comparable only between
  records with the same tokenizer.

    python benchmarks/gpu/issue22_ttft.py [RESULTS_DIR ...]

The plan's parts: the way in (``request_s`` + 512 x ``prompt_token_s``), the prefill step (each
layer the longer of its GPU work and the host's launch of it, ``layer_launch_s``, + the step
overhead), the first token's way out (one front-end step for one sequence). Read after the runs:
agreement, not validation.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

import issue22_table  # noqa: E402  (the same directory)

from launcher.model.modelspec import load_model_spec  # noqa: E402
from launcher.planner import costmodel  # noqa: E402
from launcher.planner.layouts import Links, Shape, best_candidate  # noqa: E402
from launcher.planner.plan import Policy  # noqa: E402
from launcher.probe.topology import load_topology  # noqa: E402

RESULTS = ROOT / "benchmarks" / "gpu" / "results"
DEFAULT = [RESULTS / "2026-12-02-h200-table", RESULTS / "2026-12-02-h200-table2"]
TOPOLOGY = ROOT / "benchmarks" / "gpu" / "results" / "2026-12-01-h200-lead" / "h200-probe.json"
MODELS = ROOT / "benchmarks" / "gpu" / "models"
PROMPT = 512
_DYNAMO = re.compile(r"Dynamo bytecode transform time: ([0-9.]+) s")
_TOKENIZE = re.compile(r"POST /tokenize 200 ([0-9.]+)ms")


def host_evidence(folder: Path) -> tuple[float | None, float | None]:
    """(Dynamo seconds, /tokenize median ms) from the record's own logs; None where absent."""
    dynamo = tok = None
    for log in sorted((folder / "logs").glob("vllm-*.log")):
        m = _DYNAMO.search(log.read_text(errors="replace"))
        if m:
            dynamo = float(m.group(1))
            break
    times = [float(x) for log in sorted((folder / "logs").glob("proxy-*.log"))
             for x in _TOKENIZE.findall(log.read_text(errors="replace"))]
    if times:
        tok = statistics.median(times)
    return dynamo, tok


def main(argv: list[str]) -> int:
    dirs = [Path(a) for a in argv] or DEFAULT
    topo = load_topology(str(TOPOLOGY), {})
    print("| record | layers | vocab | measured ms | plan ms | way in | prefill step (layers on "
          "the launch floor) | way out | Dynamo s/layer | /tokenize ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for d in dirs:
        for folder in sorted(p for p in d.iterdir() if (p / "single.json").is_file()):
            case = folder.name
            if case not in issue22_table.MODEL:
                continue
            s = json.loads((folder / "single.json").read_text())["summary"]["ttft_s"]["p50"]
            m = load_model_spec(str(MODELS / issue22_table.MODEL[case]))
            _, lay = best_candidate(m, Policy(force_tp=1, force_pp=1, force_dp=1), Links(topo),
                                    topo.gpus, Shape(1, 1, 1))
            if lay is None:
                continue
            way_in = lay.host.request_s + PROMPT * lay.host.prompt_token_s
            way_out = lay.host.step_floor_s(1)
            step = costmodel.prefill_step_s(m, lay, PROMPT)
            gpu_only = costmodel.prefill_step_s(m, replace(
                lay, host=replace(lay.host, layer_launch_s=0.0, step_s=0.0, seq_step_s=0.0)),
                PROMPT)
            floor = "on it" if step > gpu_only + 1e-6 else "above it"
            total = way_in + step + way_out
            dyn, tok = host_evidence(folder)
            print(f"| {d.name}/{case} | {m.num_layers} | {m.vocab_size:,} | {s * 1e3:.1f} | "
                  f"{total * 1e3:.1f} ({(total / s - 1) * 100:+.0f}%) | {way_in * 1e3:.1f} | "
                  f"{step * 1e3:.1f} ({floor}; GPU alone {gpu_only * 1e3:.1f}) | "
                  f"{way_out * 1e3:.1f} | "
                  f"{'-' if dyn is None else f'{dyn / m.num_layers:.3f}'} | "
                  f"{'-' if tok is None else f'{tok:.1f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
