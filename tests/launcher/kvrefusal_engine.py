"""A stand-in `vllm serve` that refuses a context longer than its KV cache holds, as vLLM does.

Started by `launcher serve` through TOPOSERVE_ENGINE_CMD. A ``--max-model-len`` above
KV_LIMIT_TOKENS gets vLLM 0.26's refusal, word for word as the H200 logged it (with the numbers
of this start) and exit 1; otherwise it serves as tests/serve/standin_engine.py does (which
also records every start in $STANDIN_STATE/starts).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

REFUSAL = (
    "(EngineCore pid=900) ERROR 12-01 08:54:10 [core.py:1330] ValueError: To serve at least one "
    "request with the model's max seq len ({asked}), (17.98 GiB KV cache is needed, which is "
    "larger than the available KV cache memory (16.48 GiB). Based on the available memory, the "
    "estimated maximum model length is {fits}. Try increasing `gpu_memory_utilization` (which "
    "also controls CPU memory on the CPU backend) or decreasing `max_model_len` when "
    "initializing the engine. See https://docs.vllm.ai/en/latest/configuration/"
    "conserving_memory/ for more details."
)
STANDIN = Path(__file__).resolve().parents[1] / "serve" / "standin_engine.py"


def main() -> None:
    limit = int(os.environ["KV_LIMIT_TOKENS"])
    argv = sys.argv
    # the last one wins, as with vLLM's own argument parser (the user's flags come last)
    flags = [i for i, a in enumerate(argv) if a == "--max-model-len"]
    asked = int(argv[flags[-1] + 1]) if flags else 0
    if asked > limit:
        state = Path(os.environ.get("STANDIN_STATE", "/tmp/standin"))
        state.mkdir(parents=True, exist_ok=True)
        with (state / "refused").open("a") as fh:
            fh.write(f"{asked}\n")
        print(REFUSAL.format(asked=asked, fits=limit), flush=True)
        sys.exit(1)
    sys.argv = [str(STANDIN), *argv[1:]]
    runpy.run_path(str(STANDIN), run_name="__main__")


if __name__ == "__main__":
    main()
