"""The engine core's per-step KV bookkeeping per running sequence, by how many KV-cache groups
vLLM forms (issue 22: sliding-window models' 32-stream decode slower than planned), timed with
the installed vLLM's own classes, one thread (hardware.H200_KV_GROUP_SEQ_STEP_S is its figure):

    flock /tmp/toposerve-heavy.lock .venv/bin/python benchmarks/vllm_kv_group_cost.py [ROUNDS]

For each spec (one group of full attention, a dense model; Gemma-2's 2; Gemma-3-1B's 7, 1 full
group of 4 layers and 6 sliding-window groups of 4, as launcher/planner/memfit.vllm_group_count
counts them) it builds vLLM's KVCacheConfig from KVCacheGroupSpec / FullAttentionSpec /
SlidingWindowSpec, vLLM's own Scheduler on a VllmConfig from EngineArgs (prefix caching on, block
hashing) and the worker's MultiGroupBlockTable, adds 32 requests of distinct 512-token prompts
and runs them to 256 tokens: every step ``Scheduler.schedule`` (per running request
KVCacheManager.allocate_slots: each group's remove_skipped_blocks, get_num_blocks_to_allocate,
allocate_new_blocks, cache_blocks; the new blocks' ids per group in the output), the worker's
``append_row`` of the new blocks and ``commit_block_table``, and ``update_from_output`` with one
sampled token a request. Only the decode steps of all 32 are counted. It prints the time per
running sequence per step and, per round, the extra per group in units of the probe's reference
workload (launcher/probe/hostcost.reference_work) timed beside it: the host's own speed.

Not timed: the model runner's inputs and attention metadata (one builder per group), the GPU's
work. The worker part is vLLM 0.32's v1 block table; the H200 served vLLM 0.26 (its v2 model
runner); the scheduler's part is nearly all of the figure."""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
from vllm.config import VllmConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.block_table import MultiGroupBlockTable

from launcher.probe.hostcost import reference_work

BLOCK = 16
SEQS = 32
PROMPT = 512
DECODE = 256
MAX_LEN = 4096
NUM_BLOCKS = 20_000
MODEL = "benchmarks/gpu/models/qwen2.5-1.5b-shape"


@dataclass(frozen=True)
class Shape:
    name: str
    full_groups: int
    sliding_groups: int
    window: int = 512

    @property
    def groups(self) -> int:
        return self.full_groups + self.sliding_groups


def _config(shape: Shape) -> KVCacheConfig:
    """vLLM's KVCacheConfig for ``shape``: one group per block table, a layer a group here (the
    bookkeeping is per group, not per layer: a group's layers share its block table)."""
    kw = dict(block_size=BLOCK, num_kv_heads=1, head_size=256, dtype=torch.bfloat16)
    groups: list[KVCacheGroupSpec] = []
    for i in range(shape.groups):
        spec: KVCacheSpec = (FullAttentionSpec(**kw) if i < shape.full_groups
                             else SlidingWindowSpec(sliding_window=shape.window, **kw))
        groups.append(KVCacheGroupSpec([f"layer.{i}"], spec))
    page = groups[0].kv_cache_spec.page_size_bytes
    tensors = [KVCacheTensor(size=page * NUM_BLOCKS, layers=[f"layer.{i}"],
                             layer_stride=page * NUM_BLOCKS, block_stride=page)
               for i in range(shape.groups)]
    return KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=tensors, kv_cache_groups=groups)


def _engine_config() -> VllmConfig:
    """A VllmConfig as the engine core builds it (a local dense shape; the KV groups come from
    :func:`_config`, not from the model: the scheduler reads only the KVCacheConfig's groups)."""
    args = EngineArgs(model=MODEL, load_format="dummy", skip_tokenizer_init=True,
                      max_model_len=MAX_LEN, enable_prefix_caching=True)
    cfg = args.create_engine_config()
    cfg.cache_config.num_gpu_blocks = NUM_BLOCKS  # what the worker's profiling would report
    return cfg


def add_requests(sched: Scheduler, n: int, prompt: int, params: SamplingParams,
                 seed: int) -> None:
    """``n`` requests of distinct ``prompt``-token prompts (no prefix hits, as loadgen's
    streams), their blocks hashed on the way in (not timed)."""
    hasher = get_request_block_hasher(BLOCK, get_hash_fn_by_name("sha256_cbor"))
    for r in range(n):
        ids = [(seed * 7919 + r * 104729 + t) % 50_000 for t in range(prompt)]
        sched.add_request(Request(f"r{r}", ids, params, None, block_hasher=hasher))


def run_once(cfg: VllmConfig, shape: Shape, seed: int) -> float:
    """Seconds of the engine core's step bookkeeping per running sequence per decode step:
    ``Scheduler.schedule`` + ``update_from_output`` and the worker's block-table updates."""
    sched = Scheduler(cfg, _config(shape), StructuredOutputManager(cfg), block_size=BLOCK,
                      hash_block_size=BLOCK)
    table = MultiGroupBlockTable(max_num_reqs=SEQS, max_num_batched_tokens=8192,
                                 pin_memory=False, device=torch.device("cpu"),
                                 block_sizes=[BLOCK] * shape.groups,
                                 max_num_blocks=[MAX_LEN // BLOCK] * shape.groups)
    add_requests(sched, SEQS, PROMPT, SamplingParams(max_tokens=DECODE, ignore_eos=True), seed)
    rows: dict[str, int] = {}
    spent, steps = 0.0, 0
    while True:
        t0 = time.perf_counter()
        out = sched.schedule()
        ids = list(out.num_scheduled_tokens)
        if not ids:
            break
        for new in out.scheduled_new_reqs:  # the worker's _update_states, block tables only
            rows[new.req_id] = len(rows)
            table.add_row(new.block_ids, rows[new.req_id])
        cached = out.scheduled_cached_reqs
        for req_id, block_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            if block_ids is not None:
                table.append_row(block_ids, rows[req_id])
        table.commit_block_table(len(rows))
        result = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                   sampled_token_ids=[[1] for _ in ids])
        sched.update_from_output(out, result)
        dt = time.perf_counter() - t0
        if out.total_num_scheduled_tokens == SEQS == len(ids):  # a decode step of every stream
            spent += dt
            steps += 1
    return spent / (steps * SEQS)


def reference_s(rounds: int = 30) -> float:
    """The probe's reference workload, least of ``rounds`` (this host's fast state)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        reference_work()
        best = min(best, time.perf_counter() - t0)
    return best


SHAPES = (Shape("dense (1 group)", 1, 0), Shape("Gemma-2 (2 groups)", 1, 1),
          Shape("Gemma-3-1B (7 groups)", 1, 6))


def main() -> None:
    init_none_hash(get_hash_fn_by_name("sha256_cbor"))
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    cfg = _engine_config()
    refs: list[float] = []
    per: dict[str, list[float]] = {s.name: [] for s in SHAPES}
    for k in range(rounds):  # interleaved, so a slow moment lands on every shape alike
        ref = reference_s(5)
        for s in SHAPES:
            per[s.name].append(run_once(cfg, s, k))
        refs.append(min(ref, reference_s(5)))
    print(f"reference workload: {' '.join(f'{r * 1e3:.2f}' for r in refs)} ms (each round's "
          f"least of 10)")
    for s in SHAPES:
        print(f"  {s.name:24s} {statistics.median(per[s.name]) * 1e6:6.2f} us a sequence a step "
              f"(median of {rounds}; rounds: {' '.join(f'{x * 1e6:.1f}' for x in per[s.name])})")
    one = SHAPES[0]
    for s in SHAPES[1:]:
        # each round's extra per group, in units of that round's reference workload
        rel = [(x - y) / (s.groups - one.groups) / r
               for x, y, r in zip(per[s.name], per[one.name], refs, strict=True)]
        print(f"  per extra group ({s.name}): {statistics.median(rel) * 1e3:.2f} us a sequence a "
              f"step per ms of reference; at the H200 host's 0.5 ms: "
              f"{statistics.median(rel) * 0.5e-3 * 1e6:.2f} us")


if __name__ == "__main__":
    main()
