"""The engine core's host work for a PROMPT by how many KV-cache groups vLLM forms (issue 22:
Gemma-3-1B's 16k-token TTFT on the seventh H200 table 0.110 s measured against ~0.065 s
planned, where the one-group Qwen2.5-1.5B shape was right), timed with the installed vLLM's
own classes, one thread; the sibling of benchmarks/vllm_kv_group_cost.py (its shapes, its KV
configs, its reference workload):

    flock /tmp/toposerve-heavy.lock \
        .venv/bin/python benchmarks/vllm_kv_group_prompt_cost.py [ROUNDS]

Cases, each for 1, 2 and 7 groups (Gemma-3-1B: 1 full group of 4 layers + 6 sliding-window
groups of 4, window 512), on vLLM's own Scheduler from EngineArgs with the H200's settings
(prefix caching, chunked prefill, max_num_batched_tokens 8192, max_model_len 32768):

- ``16k x1``: one request of 16,384 distinct tokens, two 8,192-token chunk steps;
- ``16k x4``: four at once, eight chunk steps;
- ``512 x1``: one request of 512 tokens, one step;
- ``decode x1``: that request's next 128 single-sequence decode steps (a step's fixed part).
- ``metadata x1`` / ``x32``: the V2 model runner's attention metadata a decode step of 1 / 32
  sequences, per group (metadata_s).

Every step: ``Scheduler.schedule`` (the new request's prefix-cache lookup over the groups;
KVCacheManager.allocate_slots: per group get_num_blocks_to_allocate, allocate_new_blocks (the
block pool's free queue), cache_blocks (the prefix cache's hash table); the sliding groups'
remove_skipped_blocks freeing the blocks that fell out of the window; the block ids per group
in the output), the worker's block tables, and ``update_from_output`` (a sampled token only for
a request whose prompt is done). Two worker block tables, each timed on its own beside the
scheduler: vLLM's v1 MultiGroupBlockTable (add_row / append_row / commit_block_table) and the
V2 model runner's BlockTables (the H200 served vLLM 0.26 with "Using V2 Model Runner":
append_block_ids per group, then apply_staged_writes' host part; its one fused triton write
kernel replaced by a no-op here, there is no triton on this CPU). Not timed: the attention
metadata builders (one per group; FlashAttention's needs CUDA) and the slot-mapping kernel (one
triton launch for all groups in the V2 runner: not per group on the host).

Printed: each case's engine-core time, median of ROUNDS, and per round, in units of the probe's
reference workload (launcher/probe/hostcost.reference_work) timed beside it, the extra per
prompt block (ceil(tokens / 16) blocks a request) per extra group, and the decode step's extra
per extra group (the fixed part a step)."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
import vllm.v1.worker.gpu.block_table as v2_block_table
import vllm.v1.worker.gpu.buffer_utils as v2_buffers
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.block_table import MultiGroupBlockTable
from vllm_kv_group_cost import BLOCK, MODEL, SHAPES, Shape, add_requests, reference_s
from vllm_kv_group_cost import _config as group_config

v2_buffers.is_uva_available = lambda: False  # no pinned memory on CPU: vLLM's own fallback


class _NoKernel:
    """Stands for a triton kernel (``kernel[grid](...)``): the launch is the GPU's, not timed."""

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *a, **k: None


v2_buffers._apply_write_kernel = _NoKernel()  # type: ignore[assignment]

MAX_LEN = 32_768
BUDGET = 8_192
MAX_SEQS = 8
NUM_BLOCKS = 80_000  # one pool for every group, as vLLM's: 4 x 1,024 blocks x 7 groups fit
DECODE_STEPS = 128
CASES = (("16k x1", 16_384, 1), ("16k x4", 16_384, 4), ("512 x1", 512, 1))


def _engine_config() -> VllmConfig:
    args = EngineArgs(model=MODEL, load_format="dummy", skip_tokenizer_init=True,
                      max_model_len=MAX_LEN, enable_prefix_caching=True,
                      enable_chunked_prefill=True, max_num_batched_tokens=BUDGET,
                      max_num_seqs=MAX_SEQS)
    cfg = args.create_engine_config()
    assert cfg.scheduler_config.max_num_batched_tokens == BUDGET
    cfg.cache_config.num_gpu_blocks = NUM_BLOCKS
    return cfg


class _Worker:
    """One of the two block tables, fed as the model runner's _update_states feeds it."""

    def __init__(self, kind: str, groups: int) -> None:
        self.kind, self.rows = kind, {}  # type: ignore[var-annotated]
        blocks = [MAX_LEN // BLOCK] * groups
        if kind == "v1":
            self.v1 = MultiGroupBlockTable(max_num_reqs=MAX_SEQS, max_num_batched_tokens=BUDGET,
                                           pin_memory=False, device=torch.device("cpu"),
                                           block_sizes=[BLOCK] * groups, max_num_blocks=blocks)
        elif kind == "v2":
            self.v2 = v2_block_table.BlockTables([BLOCK] * groups, MAX_SEQS, BUDGET, blocks,
                                                 torch.device("cpu"))

    def update(self, out: Any) -> None:
        if self.kind == "none":
            return
        for new in out.scheduled_new_reqs:
            row = self.rows[new.req_id] = len(self.rows)
            if self.kind == "v1":
                self.v1.add_row(new.block_ids, row)
            else:
                self.v2.append_block_ids(row, new.block_ids, overwrite=True)
        cached = out.scheduled_cached_reqs
        for req_id, block_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            if block_ids is not None:
                if self.kind == "v1":
                    self.v1.append_row(block_ids, self.rows[req_id])
                else:
                    self.v2.append_block_ids(self.rows[req_id], block_ids, overwrite=False)
        if self.kind == "v1":
            self.v1.commit_block_table(len(self.rows))
        else:
            self.v2.apply_staged_writes()


def run_case(cfg: VllmConfig, shape: Shape, worker: str, prompt: int, n: int, seed: int,
             decode: int = 0) -> tuple[float, float]:
    """(seconds of the steps that carry prompt chunks, seconds a decode step after them)."""
    sched = Scheduler(cfg, group_config_big(shape), StructuredOutputManager(cfg),
                      block_size=BLOCK, hash_block_size=BLOCK)
    w = _Worker(worker, shape.groups)
    # one token more than timed: a request's blocks are freed after its timed steps
    add_requests(sched, n, prompt, SamplingParams(max_tokens=decode + 2, ignore_eos=True), seed)
    prompt_s, decode_s, decode_steps = 0.0, 0.0, 0
    while True:
        t0 = time.perf_counter()
        out = sched.schedule()
        ids = list(out.num_scheduled_tokens)
        if not ids:
            break
        w.update(out)
        sampled = []
        for req_id in ids:
            req = sched.requests[req_id]
            done = req.num_computed_tokens + out.num_scheduled_tokens[req_id] >= req.num_tokens
            sampled.append([1] if done else [])
        result = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                   sampled_token_ids=sampled)
        sched.update_from_output(out, result)
        dt = time.perf_counter() - t0
        if out.total_num_scheduled_tokens > len(ids):  # a step with prompt chunks
            prompt_s += dt
        elif decode:
            decode_s += dt
            decode_steps += 1
    return prompt_s, decode_s / max(1, decode_steps)


def metadata_s(cfg: VllmConfig, shape: Shape, seqs: int, steps: int = 200) -> float:
    """Seconds a decode step of ``seqs`` sequences spends in the V2 model runner's
    build_attn_metadata loop over the groups (attn_utils.build_attn_metadata): per group one
    CommonAttentionMetadata and FlashAttentionMetadataBuilder.build (its host part; on CPU no
    FA3 ahead-of-time scheduling, which vLLM also turns off for a model with full and sliding
    layers), median of ``steps``."""
    kw = dict(block_size=BLOCK, num_kv_heads=1, head_size=256, dtype=torch.bfloat16)
    cpu = torch.device("cpu")
    with set_current_vllm_config(cfg):
        builders = [FlashAttentionMetadataBuilder(
            FullAttentionSpec(**kw) if i < shape.full_groups
            else SlidingWindowSpec(sliding_window=shape.window, **kw), [f"layer.{i}"], cfg, cpu)
            for i in range(shape.groups)]
    qsl = torch.arange(seqs + 1, dtype=torch.int32)
    lens = torch.full((seqs,), 600, dtype=torch.int32)
    tables = [torch.zeros((MAX_SEQS * 4, MAX_LEN // BLOCK), dtype=torch.int32)
              for _ in builders]
    slots = torch.zeros((len(builders), BUDGET), dtype=torch.int64)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for i, b in enumerate(builders):
            common = CommonAttentionMetadata(
                query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=lens, num_reqs=seqs,
                num_actual_tokens=seqs, max_query_len=1, max_seq_len=600,
                block_table_tensor=tables[i][:seqs], slot_mapping=slots[i][:seqs])
            b.build(0, common)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def group_config_big(shape: Shape) -> Any:
    """:func:`vllm_kv_group_cost._config` with this script's larger pool."""
    import vllm_kv_group_cost as base

    kept, base.NUM_BLOCKS = base.NUM_BLOCKS, NUM_BLOCKS
    try:
        return group_config(shape)
    finally:
        base.NUM_BLOCKS = kept


def main() -> None:
    init_none_hash(get_hash_fn_by_name("sha256_cbor"))
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    cfg = _engine_config()
    workers = ("none", "v1", "v2")
    keys = [(c, w) for c in (*CASES, ("decode x1", 512, 1)) for w in workers]
    keys += [((f"metadata x{n}", 0, n), "-") for n in (1, 32)]
    per: dict[tuple[Any, str, str], list[float]] = {}
    refs: list[float] = []
    for k in range(rounds):  # interleaved, so a slow moment lands on every shape alike
        ref = reference_s(5)
        for s in SHAPES:
            for w in workers:
                for name, prompt, n in CASES:
                    pre, _ = run_case(cfg, s, w, prompt, n, k)
                    per.setdefault((name, s.name, w), []).append(pre)
                _, dec = run_case(cfg, s, w, 512, 1, k, decode=DECODE_STEPS)
                per.setdefault(("decode x1", s.name, w), []).append(dec)
            for seqs in (1, 32):
                per.setdefault((f"metadata x{seqs}", s.name, "-"), []).append(
                    metadata_s(cfg, s, seqs))
        refs.append(min(ref, reference_s(5)))
    print(f"reference workload: {' '.join(f'{r * 1e3:.2f}' for r in refs)} ms (each round's "
          f"least of 10); budget {BUDGET} batched tokens, block {BLOCK}")
    one = SHAPES[0]
    for (name, prompt, n), w in keys:
        print(f"{name} ({w} block table):" if w != "-" else
              f"{name} (attention metadata, per decode step):")
        for s in SHAPES:
            xs = per[(name, s.name, w)]
            print(f"  {s.name:24s} {statistics.median(xs) * 1e3:8.3f} ms (rounds: "
                  f"{' '.join(f'{x * 1e3:.3f}' for x in xs)})")
        blocks = n * -(-prompt // BLOCK)
        for s in SHAPES[1:]:
            extra = s.groups - one.groups
            if name.startswith(("decode", "metadata")):
                rel = [(x - y) / extra / r for x, y, r in
                       zip(per[(name, s.name, w)], per[(name, one.name, w)], refs, strict=True)]
                med = statistics.median(rel)
                print(f"  per extra group ({s.name}): {med * 1e3:.2f} us a step per ms of "
                      f"reference; at 0.6 ms: {med * 0.6e3:.2f} us")
            else:
                rel = [(x - y) / extra / blocks / r for x, y, r in
                       zip(per[(name, s.name, w)], per[(name, one.name, w)], refs, strict=True)]
                print(f"  per prompt block per extra group ({s.name}): "
                      f"{statistics.median(rel) * 1e3:.3f} us per ms of reference; at 0.6 ms: "
                      f"{statistics.median(rel) * 0.6e3:.3f} us; this case "
                      f"{statistics.median(rel) * 0.6 * extra * blocks:.2f} ms")


if __name__ == "__main__":
    main()
