"""The simulated engine in `vllm serve`'s place (through TOPOSERVE_ENGINE_CMD), for testing how
`probe --measure` starts, times and stops the CPU engine without a real vLLM start: it takes
the port and served name the launcher gives and ignores the rest of vLLM's flags; its time to
first token and between tokens come from SIM_TTFT and SIM_ITL (seconds)."""

from __future__ import annotations

import os
import sys

from simengine.engine import main


def arg(name: str) -> str:
    return sys.argv[sys.argv.index(name) + 1]


if __name__ == "__main__":
    main(["--port", arg("--port"), "--model", arg("--served-model-name"),
          "--ttft", os.environ["SIM_TTFT"], "--itl", os.environ["SIM_ITL"]])
