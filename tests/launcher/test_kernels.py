"""The kernel table: timed on this CPU with torch, kept and read back, refused when damaged,
and turned into the step cost the scheduler simulation runs on."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.model.modelspec import load_model_spec
from launcher.planner import memfit
from launcher.planner.kernelcost import (
    AllReduce,
    as_prediction,
    predict,
    step_cost,
    step_shape,
)
from launcher.planner.schedsim import SchedulerLimits, StepBatch
from launcher.probe.kernels import (
    Attention,
    Budget,
    KernelTable,
    KernelTableError,
    KernelTime,
    Linear,
    Moe,
    StepShape,
    TableKey,
    cpu_device_name,
    cpu_isa,
    load,
    save,
    table_from_json,
    table_to_json,
    time_table,
)
from tests.support.cache import fresh_cache

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
TINY = StepShape(
    "tiny", 2, 64, 256,
    (Linear("qkv", 64, 128), Linear("o", 64, 64), Linear("gate_up", 64, 256),
     Linear("down", 128, 64)),
    (Attention(1, 4, 2, 16), Attention(1, 4, 2, 16, window=32)),
    Moe(2, 4, 2, 32),
)


def key_for(shape: StepShape, device: str = "cpu: test") -> TableKey:
    return TableKey(device, "avx2", "none", "test", shape.key())


@pytest.fixture(scope="module")
def timed() -> KernelTable:
    torch = pytest.importorskip("torch")
    return time_table(TINY, key_for(TINY), torch=torch, device="cpu", tokens=(1, 16),
                      budget=Budget(min_s=0.001, max_reps=5, rounds=2))


def test_every_operation_of_the_step_is_timed_on_the_cpu(timed: KernelTable) -> None:
    ops = {(t.op, t.tokens) for t in timed.times}
    for n in (1, 16):
        for op in ("linear:qkv", "linear:o", "linear:gate_up", "linear:down", "norm", "rope",
                   "act", "moe"):
            assert (op, n) in ops
    assert {t.group for t in timed.times if t.op == "attn:decode"} == {0, 1}
    assert {t.tokens for t in timed.times if t.op == "head"} == {1, 32}
    assert all(t.seconds > 0 for t in timed.times)
    assert any("all-reduce" in m for m in timed.missing)


def test_a_table_is_kept_and_read_back_under_its_key(timed: KernelTable, tmp_path: Path) -> None:
    assert table_from_json(json.loads(json.dumps(table_to_json(timed)))) == timed
    assert save(tmp_path, timed) is not None
    assert load(tmp_path, timed.key) == timed
    other = replace(timed.key, vllm="0.99")
    assert load(tmp_path, other) is None


def test_an_unwritable_cache_only_costs_the_saving(timed: KernelTable, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert save(blocker, timed) is None  # a file where the folder should be
    assert load(blocker, timed.key) is None


def test_the_key_changes_with_every_shape() -> None:
    assert TINY.key() != replace(TINY, hidden=65).key()
    assert TINY.key() != replace(TINY, moe=None).key()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_any_json_is_a_table_or_one_error(raw: Any) -> None:
    try:
        table_from_json(raw)
    except KernelTableError as e:
        message = str(e)
    else:
        return
    assert "\n" not in message


@given(st.sampled_from(["version", "key", "times", "shape", "method", "engine_step_s",
                        "missing", "measured_at"]), json_values)
def test_a_damaged_field_is_one_error(field: str, value: Any) -> None:
    table = KernelTable(key_for(TINY), TINY, (KernelTime("norm", 1, 1e-5),), "m", "now")
    raw = {**table_to_json(table), field: value}
    try:
        back = table_from_json(raw)
    except KernelTableError:
        return
    assert back.shape == TINY


@given(st.lists(st.tuples(st.sampled_from(["norm", "rope", "attn:prefill"]),
                          st.sampled_from([1, 512, 8192]), st.sampled_from([0, 8192])),
                min_size=1, max_size=6))
def test_a_table_timing_one_size_twice_is_one_error_not_a_plan_that_breaks(
        sizes: list[tuple[str, int, int]]) -> None:
    """Every reader interpolates an op's timings by size; two of one size (an edited or joined
    file) made the plan's step cost raise where the table was read back."""
    times = tuple(KernelTime(op, n, 1e-5 * (i + 1), ctx) for i, (op, n, ctx) in enumerate(sizes))
    raw = json.loads(json.dumps(table_to_json(KernelTable(key_for(TINY), TINY, times, "m", "now"))))
    if len(set(sizes)) == len(sizes):
        assert table_from_json(raw).times == times
        return
    with pytest.raises(KernelTableError, match="twice"):
        table_from_json(raw)


SHARED = replace(TINY, linears=(*TINY.linears, Linear("shared_gate_up", 64, 64, 16, 1),
                                 Linear("shared_down", 32, 64, 16, 1)))


def test_a_linears_own_layer_count_survives_the_json_and_keys_the_table() -> None:
    table = KernelTable(key_for(SHARED), SHARED, (KernelTime("norm", 1, 1e-5),), "m", "now")
    assert table_from_json(json.loads(json.dumps(table_to_json(table)))) == table
    assert SHARED.key() != replace(SHARED, linears=(*TINY.linears, *(
        replace(x, layers=2) for x in SHARED.linears[4:]))).key()


@given(json_values)
def test_a_damaged_linear_layer_count_is_a_table_or_one_error(value: Any) -> None:
    raw = table_to_json(KernelTable(key_for(SHARED), SHARED, (KernelTime("norm", 1, 1e-5),),
                                    "m", "now"))
    raw["shape"]["linears"][-1]["layers"] = value
    try:
        back = table_from_json(raw)
    except KernelTableError as e:
        message = str(e)
    else:
        assert back.shape.linears[-1].layers == value
        return
    assert "\n" not in message


def test_cpu_names_come_from_cpuinfo() -> None:
    text = "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2 avx512f\n"
    assert cpu_device_name(text, 2) == "cpu: AMD EPYC 7B13 (2 threads)"
    assert cpu_isa(text) == "avx2 avx512f"
    assert cpu_isa("") == "no AVX2"


# ------------------------------------------------------------------------ shapes of families


def test_dense_gqa_shape_per_tp_rank() -> None:
    s = step_shape(load_model_spec(str(MODELS / "llama-3.1-8b")), tp=2)
    lin = {x.name: (x.k, x.n) for x in s.linears}
    assert lin == {"qkv": (4096, (16 + 2 * 4) * 128), "o": (2048, 4096),
                   "gate_up": (4096, 14336), "down": (7168, 4096)}
    assert s.attention == (Attention(32, 16, 4, 128),)
    assert s.vocab == 128256 // 2


def test_mixture_of_experts_times_routed_experts_not_a_dense_mlp() -> None:
    s = step_shape(load_model_spec(str(MODELS / "qwen3-30b-a3b")))
    assert s.moe == Moe(48, 128, 8, 768)
    assert {x.name for x in s.linears} == {"qkv", "o"}


def test_latent_attention_decodes_over_one_latent_head() -> None:
    s = step_shape(load_model_spec(str(MODELS / "deepseek-v2-lite")))
    assert s.attention[0].latent
    assert s.attention[0].kv_heads == 1
    assert s.attention[0].head_dim == 512 + 64


def test_sliding_window_layers_are_their_own_attention_kind() -> None:
    s = step_shape(load_model_spec(str(MODELS / "gemma-3-27b")))
    assert sorted(a.window or 0 for a in s.attention) == [0, 1024]


def test_four_bit_weights_are_timed_as_such() -> None:
    s = step_shape(load_model_spec(str(MODELS / "llama-3.3-70b-awq")))
    assert {x.weight_bits for x in s.linears} == {4}


# ------------------------------------------------------------------------------ step cost


def synthetic_table(engine_step_s: float | None = None) -> KernelTable:
    shape = replace(TINY, moe=None, attention=(Attention(2, 4, 2, 16),))
    per = {"linear:qkv": 1e-5, "linear:o": 1e-5, "linear:gate_up": 2e-5, "linear:down": 2e-5,
           "norm": 1e-6, "rope": 1e-6, "act": 2e-6}
    times = [KernelTime(op, n, s * n) for op, s in per.items() for n in (1, 100)]
    times += [KernelTime("attn:prefill", 100, 1e-4, 100), KernelTime("attn:decode", 4, 4e-5, 100),
              KernelTime("head", 1, 1e-4), KernelTime("head", 32, 4.1e-4)]
    return KernelTable(key_for(shape), shape, tuple(times), "synthetic", "now", engine_step_s)


def test_step_cost_adds_the_layers_operations_and_says_what_was_assumed() -> None:
    kc = step_cost(synthetic_table(), assumed_step_overhead_s=0.002)
    layer_at_1 = 1e-5 + 1e-5 + 2e-5 + 2e-5 + 2 * 1e-6 + 1e-6 + 2e-6
    assert kc.cost.forward(1) == pytest.approx(2 * layer_at_1)
    assert kc.cost.forward(100) == pytest.approx(200 * layer_at_1)
    assert kc.cost.attn_prefill_s_per_pair == pytest.approx(2 * 1e-4 / 5050)
    # one timed decode point: read through the origin, per key (4 sequences of 100 tokens)
    decoder = StepBatch(decode_seqs=1, decode_context=100)
    assert kc.cost.decode_attention(decoder) == pytest.approx(2 * 4e-5 / 400 * 100)
    assert kc.cost.sampler_s_per_seq == pytest.approx(1e-5)
    assert kc.cost.step_overhead_s == pytest.approx(0.002 + 0.9e-4)
    assert any("assumed" in s for s in kc.sources)
    measured = step_cost(synthetic_table(0.0005), assumed_step_overhead_s=0.002)
    assert measured.cost.step_overhead_s == pytest.approx(0.0005 + 0.9e-4)
    assert any("measured: 0.50 ms" in s for s in measured.sources)


def test_an_eager_step_lasts_the_longer_of_its_gpu_work_attention_included_and_its_launch(
) -> None:
    """Past the captured graphs a step's layers are launched from the host, one kernel at a
    time: the table's tight-loop eager timings do not hold that, the host profile does. The
    host launches ahead of the GPU, so a long prompt chunk's attention hides the next layers'
    launches: the step lasts the longer of the GPU's work, attention and all, and the host's
    launching (as the roofline's prompt layer), never the launching with the attention after
    it (the Qwen3-0.6B shape's 16k prompt on the eighth H200 table: +19% TTFT that way)."""
    from launcher.planner.cudagraphs import CudaGraphs, default_sizes
    from launcher.planner.hardware import SERVER_HOST, STEP_OVERHEAD_S, LayerHost
    from launcher.planner.kernelcost import HostBound

    table = synthetic_table()
    eager = tuple(KernelTime("eager:" + t.op, t.tokens, t.seconds, t.context, t.group)
                  for t in table.times if not t.op.startswith(("attn", "head")))
    attention = KernelTime("attn:prefill", 100, 0.01, 100)  # a long chunk's: 10 ms a layer
    table = replace(table, times=(*[t for t in table.times if t.op != "attn:prefill"],
                                  *eager, attention))
    gpu = step_cost(table, assumed_step_overhead_s=0.0, max_graph_tokens=10).cost
    layer_at_1 = 1e-5 + 1e-5 + 2e-5 + 2e-5 + 2 * 1e-6 + 1e-6 + 2e-6
    assert gpu.forward(100) == pytest.approx(200 * layer_at_1)  # the table's kernels alone
    chunk = StepBatch(prefill_tokens=100, prefill_pairs=5050, sampled=1)
    host = replace(SERVER_HOST, step_s=0.0, seq_step_s=0.0)

    def timer(eager_layer_s: float) -> HostBound:
        return HostBound(gpu, host, 0.0, 2, CudaGraphs(default_sizes(10)),
                         LayerHost(eager_layer_s, 1e-5))

    # the host's launching (1 ms of engine core, 2 x 10 ms of layers) between the layers'
    # kernels (13 ms) and the step's GPU work with its 20 ms of attention: the GPU's
    hidden = timer(0.01)
    assert hidden.launch_s(chunk) == pytest.approx(STEP_OVERHEAD_S + 2 * 0.01)
    assert gpu.step_s(chunk) > hidden.launch_s(chunk) > gpu.forward(100)
    assert hidden.step_s(chunk) == pytest.approx(gpu.step_s(chunk))
    # a host slower than all of it: the launching
    slow = timer(0.05)
    assert slow.step_s(chunk) == pytest.approx(STEP_OVERHEAD_S + 2 * 0.05)
    # within the graphs the kernels' own time, padded, as before
    assert timer(0.05).step_s(StepBatch(prefill_tokens=8, prefill_pairs=36, sampled=1)) < 0.01


def test_on_a_gpu_server_the_engines_step_work_runs_beside_the_gpus_step() -> None:
    """vLLM schedules asynchronously on a GPU: the engine core prepares step k+1 while the GPU
    runs step k, so its own work a step bounds the step (as the front end's does) instead of
    adding to it; the CPU engine (no host profile) runs it in series."""
    from launcher.planner.cudagraphs import VLLM_DEFAULT
    from launcher.planner.hardware import SERVER_HOST
    from launcher.planner.kernelcost import _timer

    table = synthetic_table()
    decode = StepBatch(decode_seqs=1, decode_context=100, sampled=1)
    common = {"allreduce": AllReduce(), "assumed_step_overhead_s": 0.003,
              "graphs": VLLM_DEFAULT}
    m = load_model_spec(str(MODELS / "llama-3.1-8b"))  # dense: no launch pace past a decode
    series, _ = _timer(m, table, **common)
    beside, why = _timer(m, table, **common, host=SERVER_HOST)
    gpu = step_cost(table, assumed_step_overhead_s=0.0).cost.step_s(decode)
    assert series.step_s(decode) == pytest.approx(gpu + 0.003)
    assert beside.step_s(decode) == pytest.approx(max(gpu, 0.003,
                                                      SERVER_HOST.step_floor_s(1)))
    assert any("beside the GPU's step" in w for w in why)


def test_tensor_parallel_adds_two_all_reduces_a_layer() -> None:
    ar = AllReduce(2, 10e-6, 100e9)
    base = step_cost(synthetic_table(), assumed_step_overhead_s=0.0).cost
    tp = step_cost(synthetic_table(), allreduce=ar, assumed_step_overhead_s=0.0).cost
    assert tp.forward(1) - base.forward(1) == pytest.approx(2 * 2 * ar.seconds(64 * 2))


def test_predictions_come_from_the_simulated_scheduler() -> None:
    cost = step_cost(synthetic_table(), assumed_step_overhead_s=0.001).cost
    lim = SchedulerLimits(2048, 256, 10_000)
    p = predict(cost, lim, prompt=100, gen=11, concurrency=4, request_overhead_s=0.003)
    first = StepBatch(prefill_tokens=100, prefill_pairs=100 * 50.5, sampled=1)
    assert p.ttft_s == pytest.approx(0.003 + cost.step_s(first))
    assert p.prefill_tok_s == pytest.approx(100 / p.ttft_s)
    assert p.load.max_running == 4
    assert p.throughput_tok_s == pytest.approx(4 * 11 / p.load.duration_s)
    assert p.load.tpot.p50 > 1 / p.decode_tok_s  # four rows a step cost more than one


# ------------------------------------------------------------------------------- the command


def test_probe_measure_model_times_and_keeps_the_table_on_a_machine_without_gpus(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    tiny_model_path: str,
) -> None:
    from launcher.cli.main import main
    from launcher.model.modelspec import load_model_spec
    from launcher.pipeline import enginesteps, hostcosts
    from launcher.probe import kernelprobe

    pytest.importorskip("torch")
    # a cache of its own, which the table is read back from (the session's model, linked)
    monkeypatch.setenv("TOPOSERVE_CACHE", str(fresh_cache(tmp_path, tiny_model=tiny_model_path)))
    # Without a GPU --measure also times the CPU engine's step with a real vLLM start, which
    # test_cpu_prediction.py covers, and the host's front end in a worker that imports vLLM
    # afresh (~30 s on two busy cores), which test_host_timing.py covers (the timing in
    # process, the worker's failure path); the kernel table is the point here. (The worker ran
    # here before, unchecked: --measure prints its failure as a line and goes on.)
    monkeypatch.setattr(enginesteps, "measure", lambda env: "engine decode step: (not timed)")
    monkeypatch.setattr(hostcosts, "measure", lambda env, gpus: "host front end: (not timed)")
    # this machine has no GPU (CI's neither): NVML reads none and the CPU is timed
    assert main(["probe", "--measure", "--model", tiny_model_path]) == 0
    out = capsys.readouterr().out
    assert "host front end: (not timed)" in out  # the stand-ins are what ran
    assert "kernel table for" in out
    assert "on cpu: " in out
    key = kernelprobe.cpu_key(step_shape(load_model_spec(tiny_model_path)))
    table = load(tmp_path, key)
    assert table is not None
    assert {t.op for t in table.times} >= {"linear:qkv", "norm", "attn:decode", "head"}


def test_model_without_measure_is_one_line(capsys: pytest.CaptureFixture[str],
                                           tiny_model_path: str) -> None:
    from launcher.cli.main import main

    assert main(["probe", "--model", tiny_model_path]) != 0
    assert "--measure" in capsys.readouterr().err


def test_replicas_share_the_streams_and_add_up() -> None:
    m = load_model_spec(str(MODELS / "llama-3.1-8b"))
    kw: dict[str, Any] = {"kv_bytes": 2**30, "block": 16, "batched_tokens": 8192,
                          "max_num_seqs": 256, "prompt": 100, "gen": 11, "concurrency": 8,
                          "assumed_step_overhead_s": 1e-3, "request_overhead_s": 3e-3}
    one, sources = as_prediction(m, synthetic_table(), **kw)
    two, _ = as_prediction(m, synthetic_table(), dp=2, **kw)
    assert one.batch == 8
    assert two.batch == 4
    assert two.throughput_tok_s > one.throughput_tok_s
    assert one.ttft_s == two.ttft_s  # one request alone is the same on either
    assert any("assumed" in s for s in sources)


def test_the_kernel_path_runs_as_many_requests_as_memfits_pool_holds() -> None:
    """The KV pool of a prediction from a kernel table is memfit's: Gemma 3's 52 sliding layers
    are padded to 60 and, with two 8,192-token batches in flight past their window, keep all of
    a 4,011-token request, so 4 GiB holds one such request, not the three a count of every
    layer's tokens would run."""
    m = load_model_spec(str(MODELS / "gemma-3-27b"))
    kw: dict[str, Any] = {"kv_bytes": 4 * 2**30, "block": 16, "batched_tokens": 8192,
                          "max_num_seqs": 256, "prompt": 4000, "gen": 11, "concurrency": 8,
                          "assumed_step_overhead_s": 1e-3, "request_overhead_s": 3e-3}
    pool = memfit.pool_blocks(m, kw["kv_bytes"])
    assert pool // memfit.request_blocks(m, 4011, 8192) == 1
    pred, _ = as_prediction(m, synthetic_table(), **kw)
    assert pred.batch == 1
    llama = load_model_spec(str(MODELS / "llama-3.1-8b"))  # every layer full: 16 in 8 GiB
    pred, _ = as_prediction(llama, synthetic_table(), **{**kw, "kv_bytes": 8 * 2**30})
    assert pred.batch == 8


# --------------------------------------------------------------------------- in the planner


def table_like(shape: StepShape, device: str, scale: float) -> KernelTable:
    """A kernel table for ``shape`` whose every op takes ``scale`` µs a token (plus 10 µs)."""
    ops = [f"linear:{lin.name}" for lin in shape.linears] + ["norm", "rope", "act"]
    times = [KernelTime(op, n, (10 + scale * n) * 1e-6) for op in ops for n in (1, 512, 8192)]
    times += [KernelTime("attn:prefill", 512, 1e-4, 512), KernelTime("attn:decode", 4, 1e-4, 8192),
              KernelTime("head", 1, 1e-4), KernelTime("head", 32, 2e-4)]
    return KernelTable(TableKey(device, "driver x", "none", "t", shape.key()), shape,
                       tuple(times), "synthetic", "2026-12-02T00:00:00")


def test_a_gpu_plan_uses_the_models_kernel_table_where_one_was_kept() -> None:
    from launcher.planner.plan import plan
    from launcher.planner.plantypes import Policy
    from launcher.probe.topology import load_topology

    topo = load_topology(str(MODELS.parents[0] / "topologies" / "h200x2-nvlink.nvml.json"), {})
    m = load_model_spec(str(MODELS / "llama-3.1-8b"))
    name = topo.gpus[0].name
    tables = tuple(table_like(step_shape(m, tp), name, 0.1) for tp in (1, 2))
    without = plan(topo, m, Policy())
    with_ = plan(topo, m, Policy(kernels=tables))
    assert not any("kernel table" in r for r in without.reasons)
    assert any("kernel table, measured 2026-12-02" in r for r in with_.reasons)
    assert with_.predicted != without.predicted
    # the same table, slower, predicts slower: the figures are the table's
    slow = plan(topo, m, Policy(kernels=tuple(table_like(t.shape, name, 1.0) for t in tables)))
    assert slow.predicted.prefill_tok_s < with_.predicted.prefill_tok_s


def test_a_plan_for_an_engine_with_fewer_graphs_prefills_at_the_hosts_launch_pace() -> None:
    """The engine's CUDA-graph range (from the user's vLLM flags: Policy.graph_tokens) decides
    which steps the kernel table times as replayed graphs and which as eager layers the host
    launches: a 512-token prompt past a 64-token range takes the host's pace a layer (the
    engine core's own work with it), in the plan's figure and in its simulated load alike."""
    from launcher.planner.hardware import SERVER_HOST, STEP_OVERHEAD_S
    from launcher.planner.loadsim import SimulatedPrediction
    from launcher.planner.plan import plan
    from launcher.planner.plantypes import Policy
    from launcher.probe.topology import load_topology

    topo = load_topology(str(MODELS.parents[0] / "topologies" / "h200x2-nvlink.nvml.json"), {})
    m = load_model_spec(str(MODELS / "llama-3.1-8b"))
    name = topo.gpus[0].name
    shape = step_shape(m, 1)
    eager = table_like(shape, name, 0.1)
    eager = replace(eager, times=(*eager.times, *(replace(t, op="eager:" + t.op)
                                                  for t in eager.times
                                                  if not t.op.startswith(("attn", "head")))))
    ask = {"force_tp": 1, "force_dp": 1, "kernels": (eager,)}
    graphs = plan(topo, m, Policy(**ask))  # vLLM's default: graphs to 512 tokens
    few = plan(topo, m, Policy(**ask, graph_tokens=64))
    launch = SERVER_HOST.layer_launch_s  # a saved topology plans for the shipped host
    ttft_gap = 512 / few.predicted.prefill_tok_s - 512 / graphs.predicted.prefill_tok_s
    # the step waits for the host's launching of its 32 layers instead of its (much shorter)
    # GPU work: the layers' kernels, their attention and the LM head's row
    layer_gpu = sum(_at_for(eager, op, 512) for op in ("linear:qkv", "linear:o",
                                                       "linear:gate_up", "linear:down",
                                                       "norm", "norm", "rope", "act",
                                                       "attn:prefill"))
    gpu = m.num_layers * layer_gpu + _at_for(eager, "head", 1)
    assert ttft_gap == pytest.approx(STEP_OVERHEAD_S + m.num_layers * launch - gpu, rel=0.05)
    assert isinstance(few.predicted, SimulatedPrediction)
    assert isinstance(graphs.predicted, SimulatedPrediction)
    assert few.predicted.ttft_p50_s > graphs.predicted.ttft_p50_s  # the load simulation too
    assert few.predicted.decode_tok_s == pytest.approx(graphs.predicted.decode_tok_s)  # graphs


def test_every_simulation_times_a_tables_eager_step_as_the_roofline_launches_the_model() -> None:
    """The plan's figure, its load simulation and the agent plan's sessions time a kernel
    table's steps through one constructor: an eager step of a mixture-of-experts family with
    its own host work (DeepSeek's, families.py) lasts at least the roofline's launch of that
    model's layers, not a dense layer's."""
    from launcher.planner import agent, costmodel
    from launcher.planner.cudagraphs import Requested
    from launcher.planner.hardware import SERVER_HOST
    from launcher.planner.kernelcost import layout_step
    from launcher.planner.layouts import Links, candidate_layout
    from launcher.planner.plan import plan
    from launcher.planner.plantypes import Policy
    from launcher.probe.topology import load_topology

    topo = load_topology(str(MODELS.parents[0] / "topologies" / "h200x2-nvlink.nvml.json"), {})
    m = load_model_spec(str(MODELS / "deepseek-v2-lite"))
    table = table_like(step_shape(m, 1), topo.gpus[0].name, 0.001)
    chosen = plan(topo, m, Policy(force_tp=1, force_dp=1, kernels=(table,)))
    c = next(c for c in chosen.candidates if c.kernel_table is not None)
    lay = candidate_layout(c, topo, Links(topo), c.fit.kv_budget)
    launch = costmodel.eager_host_layer_s(m, SERVER_HOST)
    assert launch > SERVER_HOST.layer_launch_s  # the MoE path and the family's own
    eager = StepBatch(prefill_tokens=512, prefill_pairs=0, sampled=1)
    lay64 = candidate_layout(c, topo, Links(topo, Requested(64)), c.fit.kv_budget)
    for timer in (layout_step(m, table, lay, max_graph_tokens=64),
                  agent.step_timer(m, lay64, (table,))):
        assert timer.step_s(eager) >= m.num_layers * launch
    assert layout_step(m, table, lay, max_graph_tokens=512).step_s(eager) < m.num_layers * launch


def _at_for(table: KernelTable, op: str, tokens: int) -> float:
    return next(t.seconds for t in table.times if t.op == op and t.tokens == tokens)


def test_a_table_of_another_gpu_or_model_is_not_used() -> None:
    from launcher.planner.plan import plan
    from launcher.planner.plantypes import Policy
    from launcher.probe.topology import load_topology

    topo = load_topology(str(MODELS.parents[0] / "topologies" / "h200x2-nvlink.nvml.json"), {})
    m = load_model_spec(str(MODELS / "llama-3.1-8b"))
    other = load_model_spec(str(MODELS / "mistral-7b"))
    tables = (table_like(step_shape(m), "NVIDIA GeForce RTX 4090", 0.1),
              table_like(step_shape(other), topo.gpus[0].name, 0.1))
    assert plan(topo, m, Policy(kernels=tables)).predicted == plan(topo, m, Policy()).predicted


def test_the_cpu_plan_uses_this_cpus_kernel_table() -> None:
    from launcher.planner.plan import plan
    from launcher.planner.plantypes import Policy
    from launcher.probe.topology import Topology

    m = load_model_spec(str(MODELS / "llama-3.2-3b"))
    table = table_like(step_shape(m), "cpu: test (2 threads)", 5.0)
    p = plan(Topology(gpus=()), m, Policy(kernels=(table,)))
    assert any("predicted from this CPU's kernel table" in r for r in p.reasons)
    assert any("engine step overhead assumed" in r for r in p.reasons)
    assert p.predicted != plan(Topology(gpus=()), m, Policy()).predicted
