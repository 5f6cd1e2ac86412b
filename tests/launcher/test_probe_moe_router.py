"""The probe's fused-MoE op routes its tokens as vLLM does, one fused top-k softmax kernel,
where torch's softmax, top-k and casts ran five (issue 22: once the kernel tables' decode
attention paid its kernel's fixed cost, the MoE shapes' decode came out 8-16% slow, the dense
shapes' within 3%; the router's four extra kernels a layer are about that)."""

from __future__ import annotations

import pytest

from launcher.probe.kernels import Attention, Moe, StepShape, TableKey


def test_the_probes_moe_op_routes_through_vllms_fused_top_k_where_it_is_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM routes a MoE layer's tokens with one fused top-k softmax kernel; the probe's op
    times that where vLLM has it (here a stand-in in torch), and the table says so."""
    torch = pytest.importorskip("torch")
    from launcher.probe import kernels

    calls: list[str] = []

    def fused_topk(x: object, scores: object, k: int, renormalize: bool) -> tuple[object, ...]:
        calls.append("topk")
        weights, ids = torch.topk(torch.softmax(scores.float(), dim=-1), k, dim=-1)
        return weights, ids.to(torch.int32), ids

    def fused_experts(x: object, w13: object, w2: object, weights: object,
                      ids: object) -> object:
        calls.append("experts")
        return x

    monkeypatch.setattr(kernels._Ops, "_vllm_moe", lambda self: (fused_experts, fused_topk))
    shape = StepShape("tiny-moe", 1, 64, 256, (), (Attention(1, 4, 2, 16),),
                      Moe(1, 4, 2, 32))
    table = kernels.time_table(shape, TableKey("cpu: test", "avx2", "none", "test", shape.key()),
                               torch=torch, device="cpu", tokens=(1,),
                               budget=kernels.Budget(min_s=0.001, max_reps=2, rounds=1))
    assert {"topk", "experts"} <= set(calls)
    assert "MoE router timed through vLLM's fused top-k softmax" in table.notes
