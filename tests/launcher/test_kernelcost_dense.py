"""A kernel table's dense attention and first-token path (issue 22's third table: the table
plans came out 41-73% fast where the roofline was within 3-26%)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from launcher.model.modelspec import load_model_spec
from launcher.planner.costmodel import causal_pairs, request_host_s
from launcher.planner.hardware import SERVER_HOST
from launcher.planner.kernelcost import HostBound, layout_prediction, step_cost, step_shape
from launcher.planner.schedsim import (
    SchedulerLimits,
    StepBatch,
    TableStepCost,
    Workload,
    simulate,
)
from launcher.probe.kernels import (
    FLASH_PREFILL_NOTE,
    GPU_PREFILL_CHUNKS,
    Attention,
    Budget,
    KernelTable,
    KernelTime,
    Linear,
    StepShape,
    TableKey,
    time_table,
)

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
SHAPE = StepShape("dense", 2, 64, 256,
                  (Linear("qkv", 64, 128), Linear("o", 64, 64), Linear("gate_up", 64, 256),
                   Linear("down", 128, 64)), (Attention(2, 4, 2, 16),))


def table(attention: list[KernelTime], notes: tuple[str, ...] = ()) -> KernelTable:
    per = {"linear:qkv": 1e-5, "linear:o": 1e-5, "linear:gate_up": 2e-5, "linear:down": 2e-5,
           "norm": 1e-6, "rope": 1e-6, "act": 2e-6}
    times = [KernelTime(op, n, s * n) for op, s in per.items() for n in (1, 100)]
    times += [*attention, KernelTime("attn:decode", 4, 4e-5, 100), KernelTime("head", 1, 1e-4),
              KernelTime("head", 32, 4.1e-4)]
    return KernelTable(TableKey("gpu", "d", "v", "t", SHAPE.key()), SHAPE, tuple(times),
                       "synthetic", "now", None, (), notes)


def test_prompt_attention_is_read_off_every_timed_point_not_the_largest_ones_rate() -> None:
    """FlashAttention over a short prompt runs far below its rate over a long chunk (the H200's
    512-token point at 2.6x the 2,048-token point's time per pair): a short prompt takes its
    own point's time, a chunk between two points lies between, and a chunk after a cached
    prefix (tokens < context) is a point of its own pairs."""
    small, big = causal_pairs(100, 0), causal_pairs(400, 0)
    chunk = causal_pairs(400, 400)  # 400 new tokens after 400 cached: context 800
    cost = step_cost(table([KernelTime("attn:prefill", 100, 1e-4, 100),
                            KernelTime("attn:prefill", 400, 4e-4, 400),
                            KernelTime("attn:prefill", 400, 2e-3, 800)]),
                     assumed_step_overhead_s=0.0).cost

    def attn(pairs: float) -> float:
        return cost.step_s(StepBatch(prefill_pairs=pairs)) - cost.step_s(StepBatch())

    assert attn(small) == pytest.approx(2 * 1e-4)  # two layers at the 100-token point
    assert attn(big) == pytest.approx(2 * 4e-4)
    assert attn(chunk) == pytest.approx(2 * 2e-3)
    mid = (big + chunk) / 2
    assert attn(mid) == pytest.approx(2 * (4e-4 + 2e-3) / 2)
    assert attn(2 * chunk) == pytest.approx(2 * 2 * 2e-3)  # past the last: in proportion
    assert attn(small / 2) == pytest.approx(1e-4)  # below the first: in proportion


def test_a_plan_says_which_kernel_timed_prompt_attention() -> None:
    sdpa = step_cost(table([KernelTime("attn:prefill", 100, 1e-4, 100)]),
                     assumed_step_overhead_s=0.0)
    flash = step_cost(table([KernelTime("attn:prefill", 100, 1e-4, 100)], (FLASH_PREFILL_NOTE,)),
                      assumed_step_overhead_s=0.0)
    assert any("SDPA, not the engine's FlashAttention" in s for s in sdpa.sources)
    assert any("(vLLM's FlashAttention)" in s for s in flash.sources)


def test_an_idle_engines_first_step_pays_its_own_work_in_series() -> None:
    """Under asynchronous scheduling the engine core prepares a step while the GPU runs the one
    before, but an idle engine's first step has none before it: its scheduling and inputs come
    first (the roofline pays STEP_OVERHEAD_S in every prefill step). Later steps hide it."""
    gpu = TableStepCost((1, 1000), (0.01, 0.01))
    timer = HostBound(gpu, replace(SERVER_HOST, step_s=0.0, seq_step_s=0.0), engine_s=0.004)
    lim = SchedulerLimits(8192, 8, 1000, async_scheduling=True)
    one = simulate(lim, timer, Workload(100, 3), request_overhead_s=0.002).requests[0]
    assert one.first_token_s == pytest.approx(0.002 + 0.004 + 0.01)
    assert one.finished_s - one.first_token_s == pytest.approx(2 * 0.01)  # hidden behind
    series = simulate(replace(lim, async_scheduling=False), gpu, Workload(100, 3),
                      request_overhead_s=0.002).requests[0]
    assert series.first_token_s == pytest.approx(0.002 + 0.01)  # a plain timer: unchanged


def test_a_table_plans_first_token_pays_the_prompts_way_in() -> None:
    """A request's way in grows with its prompt (parse, IPC, the prefix cache's hashing:
    HostProfile.prompt_token_s), as the roofline and the load simulation count it."""
    from launcher.planner.layouts import Links, candidate_layout
    from launcher.planner.plan import plan
    from launcher.planner.plantypes import Policy
    from launcher.probe.topology import load_topology

    topo = load_topology(str(MODELS.parents[0] / "topologies" / "h200x2-nvlink.nvml.json"), {})
    m = load_model_spec(str(MODELS / "llama-3.1-8b"))
    shape = step_shape(m, 1)
    ops = [f"linear:{lin.name}" for lin in shape.linears] + ["norm", "rope", "act"]
    times = [KernelTime(op, n, (10 + 0.1 * n) * 1e-6) for op in ops for n in (1, 512, 8192)]
    times += [KernelTime("attn:prefill", 512, 1e-4, 512), KernelTime("attn:decode", 4, 1e-4, 8192),
              KernelTime("head", 1, 1e-4), KernelTime("head", 32, 2e-4)]
    kt = KernelTable(TableKey(topo.gpus[0].name, "d", "none", "t", shape.key()), shape,
                     tuple(times), "synthetic", "now")
    chosen = plan(topo, m, Policy(force_tp=1, force_dp=1, kernels=(kt,)))
    c = next(c for c in chosen.candidates if c.kernel_table is not None)
    lay = candidate_layout(c, topo, Links(topo), c.fit.kv_budget)
    ask = {"batched_tokens": 8192, "max_num_seqs": 256, "gen": 4, "concurrency": 1}
    slow_in = replace(lay, host=replace(lay.host, prompt_token_s=2e-6))
    fast_in = replace(lay, host=replace(lay.host, prompt_token_s=0.0))
    got = [layout_prediction(m, (kt,), x, prompt=4096, **ask) for x in (slow_in, fast_in)]
    assert got[0] is not None
    assert got[1] is not None
    gap = got[0][0].ttft_s - got[1][0].ttft_s
    assert gap == pytest.approx(request_host_s(slow_in.host, 4096)
                                - request_host_s(fast_in.host, 4096))
    assert gap == pytest.approx(4096 * 2e-6)


def test_the_harness_times_a_long_prompts_chunks_on_a_gpu_only() -> None:
    """The chunks of a 32k-token prompt at the engine's 8,192-token budget lie within the
    timed points (on a GPU), so no long prompt is stretched from a 2,048-token one; a CPU
    table keeps its short ladder (an 8,192-token SDPA there would take minutes)."""
    last = causal_pairs(8192, 32768 - 8192)
    assert max(causal_pairs(n, d) for n, d in GPU_PREFILL_CHUNKS) >= last
    torch = pytest.importorskip("torch")
    cpu = time_table(SHAPE, TableKey("cpu: t", "x", "none", "t", SHAPE.key()), torch=torch,
                     device="cpu", tokens=(1, 16), budget=Budget(min_s=0.001, max_reps=2,
                                                                 rounds=1))
    assert {t.context for t in cpu.lookup("attn:prefill")} == {512, 2048}
    assert FLASH_PREFILL_NOTE not in cpu.notes  # SDPA timed it: the plan says so
