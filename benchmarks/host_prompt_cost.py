"""The serving host's CPU work the planner's host profile holds (launcher/planner/hardware.py
``HostProfile``), timed with the installed vLLM's own functions, one thread: what `launcher probe
--measure` times and keeps (launcher/probe/hostcost.py, the vLLM seam launcher/probe/vllmfront.py),
printed without keeping it, beside the lent H200 host's figures the shipped profile came from:

    .venv/bin/python benchmarks/host_prompt_cost.py

(Until session 11 this script held its own copy of the timing: the H200 host's figures in
benchmarks/gpu/results/2026-12-02-h200-soak32b/host-cost.txt are that copy's; the functions
are the same; the copy took the median of its repeats, the probe (hostcost.time_host) times each
function as the least of a few calls in a round and takes the median of the rounds it kept, those
whose reference workload ran within SLOW_ROUND of the fastest round's.)
"""

from __future__ import annotations

from launcher.model.tinymodel import ensure_tiny_model
from launcher.pipeline.hostcosts import key_here
from launcher.planner import hardware
from launcher.probe.hostcost import time_host
from launcher.probe.vllmfront import VllmFrontEnd


def main() -> None:
    rec = time_host(VllmFrontEnd(str(ensure_tiny_model())), key_here())
    prof = hardware.host_profile(rec)
    print(f"{rec.key.cpu}, {rec.key.cores} cores, vLLM {rec.key.vllm}:")
    print(f"  way in: {rec.request_s * 1e6:.0f} us a short request + {rec.prompt_token_s * 1e6:.3f}"
          f" us a prompt token (H200 host: {hardware.H200_HOST_TOKEN_TIMED_S * 1e6:.2f})")
    print(f"  output path: {rec.step_s * 1e6:.1f} us a step + {rec.seq_step_s * 1e6:.1f} us a "
          f"sequence (H200 host: {hardware.H200_HOST_STEP_TIMED_S * 1e6:.1f} + "
          f"{hardware.H200_HOST_SEQ_TIMED_S * 1e6:.1f})")
    print(f"  the plan's host work here: {prof.step_s * 1e3:.2f} ms + {prof.seq_step_s * 1e6:.0f}"
          f" us a sequence a step, a request {prof.request_fixed_s * 1e3:.2f} ms + "
          f"{prof.prompt_token_s * 1e6:.2f} us a prompt token")


if __name__ == "__main__":
    main()
