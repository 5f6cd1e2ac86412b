"""The KV cache dtype a GPU plan sizes with under ``--kv-cache-dtype auto``: vLLM 0.32 resolves
auto to the FP8 cache a checkpoint's quantization config asks for (ModelSpec.kv_cache_quantized,
families.vllm_auto_kv_bytes), so a plan sized at 2 bytes would hold half the KV tokens vLLM
does. The user's own --kv-cache-dtype always wins; a release whose rule is not known keeps 2
bytes, the larger (explain.user_memory_flags says so)."""

from __future__ import annotations

from dataclasses import replace

from launcher.model.families import vllm_auto_kv_bytes
from launcher.model.modelspec import ModelSpec
from launcher.planner.plantypes import Policy


def checkpoint_kv(policy: Policy, m: ModelSpec) -> Policy:
    """``policy`` with the KV bytes per element the served vLLM's auto gives ``m``: unchanged
    where the user named a dtype, the checkpoint asks for none, or the release's rule is not
    known. Applied once, by pipeline.run.choose, before the plan and the agent plan read it."""
    if policy.kv_cache_given:
        return policy
    resolved = vllm_auto_kv_bytes(policy.vllm.release, m.kv_cache_quantized)
    if resolved is None or resolved == policy.kv_cache_bytes:
        return policy
    return replace(policy, kv_cache_bytes=resolved)
