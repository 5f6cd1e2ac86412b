"""The planned context against the one vLLM 0.32's engine core accepts, run on the CPU.

For every real config in tests/fixtures/recent-models that vLLM's specs can be built for
(tests/launcher/vllm_kv_truth.py) and several golden families (sliding window, latent
attention, dense), at KV budgets from a few blocks to the model's whole context and at every
TP its KV heads allow, the plan must start (never above vLLM's figure) and stay within 5% of
it. One reference call per case (a bisection over vLLM's own grouping and check)."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from launcher.model.modelspec import GIB, load_model_spec
from launcher.planner import memfit
from tests.launcher.paths import MODELS, REPO
from tests.launcher.vllm_kv_truth import Engine, read_config, vllm_accepts, vllm_pool

RECENT = REPO / "tests" / "fixtures" / "recent-models"
BATCHED = 8192
MAX_SEQS = 1024  # vLLM's default beside 8,192 batched tokens (memfit.vllm_defaults)
# (folder, the TPs to sweep): up to 8 GPUs; TP past the KV heads replicates attention heads
# while a hybrid's recurrent state keeps dividing, the case that changes its page ratio.
CASES = [
    (RECENT / "llama-3.1-70b-instruct-fp8", (1, 8)),
    (RECENT / "minimax-m2.5", (1, 8)),
    (RECENT / "qwen3-vl-30b-a3b-instruct", (1, 8)),
    (RECENT / "gpt-oss-120b", (1, 8)),
    (RECENT / "llama-4-scout-17b-16e-instruct", (1, 8)),
    (RECENT / "deepseek-v3", (1, 8)),
    (RECENT / "kimi-k2-instruct", (1,)),
    (RECENT / "kimi-k2.5", (1,)),
    (RECENT / "qwen3-next-80b-a3b-thinking", (1, 2, 4, 8)),
    (RECENT / "nemotron-h-56b-base-8k", (1, 2, 4, 8)),
    (RECENT / "nemotron-3-nano-30b-a3b", (1, 2, 4, 8)),
    (RECENT / "nemotron-3-ultra-550b-a55b", (1, 4, 8)),
    (RECENT / "qwen3.5-27b", (1, 8)),
    (MODELS / "gemma-2-27b", (1, 2)),
    (MODELS / "gemma-3-27b", (1, 2)),
    (MODELS / "gemma-4-31b", (1, 2)),
    (MODELS / "gemma-4-26b-a4b", (1, 2)),
    (MODELS / "gpt-oss-20b", (1,)),
    (MODELS / "mistral-7b", (1,)),
    (MODELS / "llama-3.1-8b", (1, 8)),
    (MODELS / "deepseek-v2-lite", (1,)),
]
BUDGETS_GIB = (0.25, 1.0, 4.0, 16.0, 64.0)
WITHIN = 0.05
# The margin kept off the KV budget is bytes (2% of it, at most the estimate's absolute terms:
# memfit.kept_back); where sliding-window layers hold most of the budget, only the few
# full-attention layers grow with the context, and those bytes are 12% of Gemma 4's context at
# 16 GiB (gemma-4-31b: 31,232 planned, 35,424 accepted). Within 5% there takes a margin of at
# most 0.13 GiB (gemma-4-26b-a4b at 4 GiB: 0.03), below what the estimate has varied by
# between two starts (0.06 GiB) and exceeded vLLM's figure by on logged starts (0.61 GiB).
MARGIN_ON_SLIDING = pytest.mark.xfail(strict=True, reason="the byte margin over few full layers")


def _cases(*extra: tuple[str, pytest.MarkDecorator]) -> list[Any]:
    marks = dict(extra)
    return [pytest.param(folder, tps, id=folder.name,
                         marks=[m for name, m in marks.items() if name == folder.name])
            for folder, tps in CASES]


@cache
def _figures(folder: Path, tp: int, gib: float) -> tuple[int, int, int]:
    """vLLM's accepted context, memfit's longest and its planned one for ``gib`` GiB of KV
    cache on each of ``tp`` GPUs."""
    m = load_model_spec(str(folder))
    accepted = vllm_accepts(read_config(folder), int(gib * GIB), Engine(tp=tp,
                                                                        batched_tokens=BATCHED))
    share, replica = memfit.tp_share(m, tp), gib * GIB * memfit.kv_shards(m, tp, 1)
    # the margin a plan on a card of these limits keeps (memfit.context_cushion)
    cushion = memfit.context_cushion(
        memfit.overhead_per_gpu(m, tp, 1, memfit.EngineLimits(BATCHED, MAX_SEQS)),
        memfit.kv_shards(m, tp, 1))
    return (accepted, memfit.longest_context(share, replica, BATCHED),
            memfit.planned_context(share, replica, BATCHED, cushion=cushion))


def _step(folder: Path, tp: int) -> int:
    """The tokens one more block of the model's KV takes (a hybrid's enlarged block)."""
    return memfit.state_block_tokens(memfit.tp_share(load_model_spec(str(folder)), tp))


@pytest.mark.parametrize(("folder", "tps"), _cases())
def test_the_longest_context_is_vllms_to_within_one_block_below(
    folder: Path, tps: tuple[int, ...]
) -> None:
    misses = [f"TP{tp} {gib} GiB: memfit {longest}, vLLM {accepted}"
              for tp in tps for gib in BUDGETS_GIB
              for accepted, longest, _ in [_figures(folder, tp, gib)]
              if not accepted - _step(folder, tp) <= longest <= accepted]
    assert not misses, "; ".join(misses)


@pytest.mark.parametrize(("folder", "tps"), _cases())
def test_the_planned_context_starts(folder: Path, tps: tuple[int, ...]) -> None:
    misses = [f"TP{tp} {gib} GiB: planned {planned}, vLLM {accepted}"
              for tp in tps for gib in BUDGETS_GIB
              for accepted, _, planned in [_figures(folder, tp, gib)]
              if planned > accepted]
    assert not misses, "; ".join(misses)


@pytest.mark.parametrize(("folder", "tps"), _cases(("gemma-4-31b", MARGIN_ON_SLIDING),
                                                   ("gemma-4-26b-a4b", MARGIN_ON_SLIDING)))
def test_the_planned_context_is_within_5_percent_of_what_vllm_accepts(
    folder: Path, tps: tuple[int, ...]
) -> None:
    # a hybrid's context moves in its enlarged blocks (544 tokens for Qwen3-Next, 8,304 for
    # Nemotron-3-Ultra): where one is more than 5% of the context, the margin may cost it
    misses = [f"TP{tp} {gib} GiB: planned {planned}, vLLM {accepted}"
              for tp in tps for gib in BUDGETS_GIB
              for accepted, _, planned in [_figures(folder, tp, gib)]
              if planned < min(accepted * (1 - WITHIN), accepted - _step(folder, tp))]
    assert not misses, "; ".join(misses)


# (folder, GiB of KV, tokens a request): a dense model whose pool divides evenly into its
# requests (vLLM logs 4.00x, three fit), sliding windows, a hybrid's state blocks, latent attention
POOLS = [
    (MODELS / "llama-3.1-8b", 4.0, 8192),
    (MODELS / "llama-3.1-8b", 3.0, 5000),
    (MODELS / "gemma-3-27b", 4.0, 4096),
    (MODELS / "gemma-4-31b", 32.0, 16384),
    (RECENT / "qwen3-next-80b-a3b-thinking", 4.0, 16384),
    (RECENT / "nemotron-h-56b-base-8k", 4.0, 8192),
    (MODELS / "deepseek-v2-lite", 2.0, 8192),
]


@pytest.mark.parametrize(("folder", "gib", "tokens"), POOLS,
                         ids=[f"{f.name}-{g}GiB-{t}" for f, g, t in POOLS])
def test_the_requests_held_at_once_are_the_free_blocks_of_vllms_pool_over_one_requests(
    folder: Path, gib: float, tokens: int
) -> None:
    m = load_model_spec(str(folder))
    pool = vllm_pool(read_config(folder), int(gib * GIB), tokens, Engine(batched_tokens=BATCHED))
    blocks = memfit.pool_blocks(m, gib * GIB)
    per = round(pool.num_blocks / pool.concurrency)  # vLLM's blocks of one request
    held = pool.free_blocks // per  # the null block is never a request's
    fit = memfit.Fit(0.0, 0.0, 0.0, gib * GIB, tokens, memfit.EngineLimits(BATCHED, MAX_SEQS),
                     math.inf, kv_blocks=blocks)
    assert memfit.sequences_held(m, fit, tokens) == max(1, held)
    if len({g.bytes_per_token() for g, _ in memfit.vllm_groups(m)}) == 1:
        # one page size: memfit's pool and request are vLLM's blocks (with several, Gemma 4's,
        # memfit counts a block of every layer and sizes a request in those)
        assert (blocks, memfit.request_blocks(m, tokens, BATCHED)) == (pool.num_blocks, per)
    if pool.num_blocks % per == 0:  # vLLM's logged figure counts the null block as room
        assert held == pool.concurrency - 1


@pytest.mark.parametrize("folder", [RECENT / "nemotron-h-56b-base-8k", RECENT / "qwen3.5-27b"],
                         ids=lambda f: f.name)
def test_a_config_without_its_state_dtype_key_is_sized_as_vllm_defaults_it(
    folder: Path, tmp_path: Path
) -> None:
    # vLLM falls back per family when the key is absent: Nemotron-H's state to float32,
    # Qwen3.5's to the model's dtype (16 bits); a wrong fallback moves the context by ~2x
    raw = json.loads((folder / "config.json").read_text())
    for fields in (raw, raw.get("text_config") or {}):
        fields.pop("mamba_ssm_cache_dtype", None)
        fields.pop("mamba_ssm_dtype", None)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    m = load_model_spec(str(tmp_path))
    for gib in (1.0, 16.0):
        accepted = vllm_accepts(read_config(tmp_path), int(gib * GIB), Engine(tp=1,
                                                                                batched_tokens=BATCHED))
        longest = memfit.longest_context(memfit.tp_share(m, 1), gib * GIB, BATCHED)
        assert accepted - memfit.state_block_tokens(memfit.tp_share(m, 1)) <= longest <= accepted
