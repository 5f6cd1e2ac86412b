"""The engine's own step time for one model, through vLLM's offline engine (issue 22).

The kernel table times the operations of a step; what vLLM adds around them (scheduling, input
preparation, sampling bookkeeping, output processing, and for an eager step the host's launch
of every kernel) is this step time less the table's sum. Runs wherever vLLM does:

    python benchmarks/gpu/engine_step.py MODEL_DIR [--dummy] [--out FILE]

Prints and writes: time to first token of one 512-token prompt (gen 1), the decode step of one
stream ((t(gen 129) - t(gen 1)) / 128) and of 32 streams, each the best of two runs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--dummy", action="store_true", help="random weights of the real shape")
    p.add_argument("--out", type=Path)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--capture", type=int, default=0,
                   help="capture CUDA graphs up to this batch only (the earlier H200 runs: 64)")
    args = p.parse_args()
    from vllm import LLM, SamplingParams

    kw: dict[str, Any] = {"load_format": "dummy"} if args.dummy else {}
    if args.capture:
        sizes = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if n <= args.capture]
        kw["compilation_config"] = {"cudagraph_capture_sizes": sizes}
    llm = LLM(model=args.model, max_model_len=args.max_model_len, **kw)
    vocab = 4000

    def run(n: int, gen: int, streams: int = 1) -> float:
        sp = SamplingParams(max_tokens=gen, min_tokens=gen, ignore_eos=True)
        prompts = [{"prompt_token_ids": [(i * 7 + s * 13 + int(time.time() * 1e3)) % vocab + 10
                                         for i in range(n)]} for s in range(streams)]
        t0 = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)  # type: ignore[arg-type]
        return time.perf_counter() - t0

    run(512, 4)
    ttft = min(run(512, 1) for _ in range(2))
    one = min(run(512, 129) - run(512, 1) for _ in range(2)) / 128
    many = min(run(512, 129, 32) - run(512, 1, 32) for _ in range(2)) / 128
    result = {"model": args.model, "ttft_512_s": ttft, "decode_step_1_s": one,
              "decode_step_32_s": many, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    print(json.dumps(result), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
