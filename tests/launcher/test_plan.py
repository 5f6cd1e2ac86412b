"""The planner, table-driven over recorded topologies × real model configs, with invariants on
every case, plus the field anchors the cost model must reproduce."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.engine.render import render
from launcher.errors import PlanError
from launcher.model.modelspec import ModelSpec, load_model_spec
from launcher.planner import costmodel
from launcher.planner.costmodel import Link
from launcher.planner.plan import Candidate, Plan, Policy, plan
from launcher.probe.topology import Gpu, Measured, Topology, load_topology
from tests.launcher.paths import TOPOLOGIES as TOPOLOGY_DIR
from tests.launcher.paths import model, topo

TOPOLOGIES = [
    "h200x2-nvlink",
    "2x3090-nvlink-x8x8",
    "2x3090-pcie-x8x8-nop2p",
    "2x3090-p2p-x16",
    "3x3090-one-x4",
    "4x4090-2socket",
    "8xh100-nvswitch",
    "mixed-3090-4090",
]
MODELS = [
    "llama-3.3-70b",
    "llama-3.3-70b-awq",
    "qwen2.5-32b",
    "gemma-3-27b",
    "gemma-2-27b",
    "mistral-7b",
    "qwen3-32b",
    "qwen3-30b-a3b",
]


def T(name: str) -> Topology:
    return load_topology(topo(name), {})


def M(name: str) -> ModelSpec:
    return load_model_spec(model(name))


def pick(p: Plan, tp: int, pp: int, dp: int = 1) -> Candidate:
    [c] = [c for c in p.candidates if (c.tp, c.pp, c.dp) == (tp, pp, dp)]
    return c


def check_invariants(t: Topology, m: ModelSpec, p: Plan) -> None:
    assert m.num_heads % p.tp == 0
    assert p.pp <= m.num_layers  # vLLM splits uneven layer counts (62 → 21/21/20)
    assert p.tp * p.pp * p.dp == len(p.gpus)
    assert len(set(p.gpus)) == len(p.gpus)
    assert set(p.gpus) <= {g.index for g in t.gpus}
    chosen = [c for c in p.candidates if (c.tp, c.pp, c.dp, c.gpus) == (p.tp, p.pp, p.dp, p.gpus)]
    assert len(chosen) == 1
    assert chosen[0].need_gib <= chosen[0].budget_gib  # the plan fits
    pr = p.predicted
    assert pr.prefill_tok_s > pr.decode_tok_s > 0
    assert pr.throughput_tok_s > 0
    assert pr.e2e_s > pr.ttft_s > 0
    assert min(4096, m.max_position_embeddings) <= p.max_model_len <= m.max_position_embeddings
    for c in p.candidates:
        assert (c.predicted is None) != (c.rejected is None)
        assert (c.scores is None) == (c.predicted is None)
        if c.scores:
            assert 0 < c.scores.interactive <= 1
            assert 0 < c.scores.throughput <= 1
    # TP beats layer split on the same GPUs for one stream's tokens on any link; for prompts
    # on two GPUs with a dense model (with more GPUs over host memory across sockets, or with a
    # mixture-of-experts that computes little per token, the all-reduces can cost more)
    for c in p.candidates:
        if c.tp > 1 and c.pp == 1 and c.dp == 1 and c.predicted:
            pp = [o for o in p.candidates if (o.tp, o.pp, o.dp) == (1, c.tp, 1) and o.predicted]
            for o in pp:
                assert o.predicted is not None
                assert c.predicted.decode_tok_s > o.predicted.decode_tok_s
                # ... for 70B-class models, where the prompt's arithmetic dominates. Smaller
                # ones compute a prompt so fast that the fixed per-layer cost of an eager
                # prefill (hardware.EAGER_LAYER_S) and the all-reduces can tip it: measured
                # on 2 x H200 over SHM, TP=2 and PP=2 prefilled a 512-token prompt alike.
                if c.tp == 2 and not m.num_experts and m.params > 50e9:
                    assert c.predicted.prefill_tok_s > o.predicted.prefill_tok_s
    r = render(p, m.name, served_name=None, host="127.0.0.1", port=8000)
    assert r.argv[:3] == ("vllm", "serve", m.name)
    assert r.argv[r.argv.index("--tensor-parallel-size") + 1] == str(p.tp)
    # one engine per replica, each on its slice of the plan's GPUs
    assert ",".join(e.env["CUDA_VISIBLE_DEVICES"] for e in r.engines) == ",".join(map(str, p.gpus))
    assert r.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


@pytest.mark.parametrize("workload", ["interactive", "throughput"])
@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("topo_name", TOPOLOGIES)
def test_every_topology_and_model(topo_name: str, model_name: str, workload: str) -> None:
    t, m = T(topo_name), M(model_name)
    room = sum(g.memory_bytes for g in t.gpus) * 0.9
    try:
        p: Plan | PlanError = plan(t, m, Policy(workload=workload))
    except PlanError as exc:
        p = exc
    if isinstance(p, PlanError):
        # the only acceptable failure: it cannot fit, and the message says by how much
        assert m.weight_bytes > room * 0.7
        assert re.search(r"needs [\d.]+ GiB per GPU .* has [\d.]+ GiB per GPU", str(p))
        assert "Would fit: " in str(p)
    else:
        assert m.weight_bytes < room
        check_invariants(t, m, p)


def test_h200_llama_70b_chooses_tp2_for_interactive() -> None:
    p = plan(T("h200x2-nvlink"), M("llama-3.3-70b"), Policy())
    assert (p.mode, p.tp, p.pp, p.dp, p.gpus, p.transport) == ("tp", 2, 1, 1, (0, 1), "nvlink")
    text = "\n".join(p.reasons)
    assert "NV18" in text
    assert "one GPU" in text
    assert "126.4 GiB" in text
    assert "chosen for interactive" in text
    assert p.predicted.decode_tok_s > pick(p, 1, 2).predicted.decode_tok_s  # type: ignore[union-attr]


# ------------------------------------------------------------------------ the field anchors

AWQ = "llama-3.3-70b-awq"


def forced(t: Topology, tp: int, pp: int) -> Plan:
    return plan(t, M(AWQ), Policy(force_tp=tp, force_pp=pp, force_dp=1))


def with_width(t: Topology, width: int) -> Topology:
    return replace(t, gpus=tuple(replace(g, pcie_width_cur=width) for g in t.gpus))


def test_nvlink_lifts_tp_prefill_over_shm_but_not_decode() -> None:
    # The field's 2 x 3090 figure is ~30%. It was reproduced with an SHM factor (0.33 of the
    # PCIe rate) fitted to it; issue 14 replaced that with the ratio measured on the H200s
    # (NCCL over SHM 27.3 GB/s of a 50.4 GB/s PCIe Gen5 x16 link: 0.54), which predicts a
    # smaller lift here (~16%). The 3090 board's SHM rate was never measured by this project;
    # `probe --measure` replaces the assumption on a real machine.
    nvl = forced(T("2x3090-nvlink-x8x8"), 2, 1).predicted
    shm = forced(T("2x3090-pcie-x8x8-nop2p"), 2, 1).predicted
    assert 1.1 < nvl.prefill_tok_s / shm.prefill_tok_s < 1.4
    assert 1.0 <= nvl.decode_tok_s / shm.decode_tok_s < 1.1


def test_layer_split_is_nearly_indifferent_to_the_link() -> None:
    nvl = forced(T("2x3090-nvlink-x8x8"), 1, 2).predicted
    shm = forced(T("2x3090-pcie-x8x8-nop2p"), 1, 2).predicted
    assert nvl.prefill_tok_s / shm.prefill_tok_s == pytest.approx(1.0, abs=0.02)
    assert nvl.decode_tok_s / shm.decode_tok_s == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize(("width", "loss"), [(8, 0.05), (4, 0.15)])
def test_p2p_over_narrower_pcie_loses_as_measured(width: int, loss: float) -> None:
    x16 = T("2x3090-p2p-x16")
    full = forced(x16, 2, 1).predicted.prefill_tok_s
    narrow = forced(with_width(x16, width), 2, 1).predicted.prefill_tok_s
    assert 1 - narrow / full == pytest.approx(loss, abs=0.03)


def test_measured_link_overrides_the_assumed_one() -> None:
    t = T("2x3090-nvlink-x8x8")
    slow = replace(t, pairs=(replace(t.pairs[0], measured=Measured(bandwidth_gbs=5.0)),))
    assert forced(slow, 2, 1).predicted.prefill_tok_s < forced(t, 2, 1).predicted.prefill_tok_s


# --------------------------------------------------------------------------- choices


def test_workloads_are_scored_separately_and_can_disagree() -> None:
    t, m = T("2x3090-pcie-x8x8-nop2p"), M("mistral-7b")
    inter = plan(t, m, Policy(workload="interactive"))
    thru = plan(t, m, Policy(workload="throughput", concurrency=64))
    assert (inter.tp, inter.dp) == (2, 1)
    assert (thru.tp, thru.dp) == (1, 2)
    # and the same candidates carry both scores
    for c in inter.candidates:
        if c.scores:
            assert c.scores.interactive > 0
            assert c.scores.throughput > 0


def test_replicas_do_not_win_throughput_by_rule_nvlink_keeps_tp() -> None:
    # the same model and concurrency as above; NVLink changes the answer for few streams
    p = plan(T("2x3090-nvlink-x8x8"), M("mistral-7b"), Policy(workload="throughput", concurrency=8))
    assert (p.tp, p.dp) == (2, 1)


def test_the_gpu_at_x4_is_left_out_of_tensor_parallel() -> None:
    p = plan(T("3x3090-one-x4"), M(AWQ), Policy())
    assert p.tp == 2
    assert p.gpus == (0, 1)


def test_replicas_keep_tp_groups_inside_a_socket() -> None:
    # Two TP=2 replicas forced: which layout wins throughput here is a knife-edge of the KV
    # left beside a 70B AWQ on 24 GB cards (since issue 14's fuller overhead model, TP=2 x PP=2
    # is 7% ahead); the grouping is what this test is about.
    policy = Policy(workload="throughput", concurrency=64, force_tp=2, force_pp=1, force_dp=2)
    p = plan(T("4x4090-2socket"), M(AWQ), policy)
    assert (p.tp, p.dp) == (2, 2)
    groups = {frozenset(p.gpus[:2]), frozenset(p.gpus[2:])}
    assert groups == {frozenset({0, 1}), frozenset({2, 3})}


def test_mixed_cards_are_sized_to_the_smallest_and_say_so() -> None:
    p = plan(T("mixed-3090-4090"), M(AWQ), Policy())
    assert "mixed GPU models" in "\n".join(p.reasons)
    t = T("mixed-3090-4090")
    smallest = min(g.memory_bytes for g in t.gpus)
    c = pick(p, 2, 1)
    assert c.budget_gib == round(smallest * 0.9 / 2**30, 1)


def test_memory_a_desktop_holds_lowers_the_utilization_vllm_is_started_with() -> None:
    desk = T("2x3090-desktop-on-gpu0")  # 3 GiB in use on GPU0, an idle 0.3 GiB on GPU1
    p = plan(desk, M("llama-3.1-8b"), Policy())
    # (24 - 3 - 0.5 for the worker's own CUDA context) / 24 = 0.854: vLLM starts at 0.85
    assert p.gpus == (0, 1)
    assert p.gpu_memory_utilization == 0.85
    r = render(p, "m", served_name=None, host="127.0.0.1", port=8000)
    assert r.argv[r.argv.index("--gpu-memory-utilization") + 1] == "0.85"
    assert any(s.startswith("--gpu-memory-utilization 0.85 instead of 0.9: other processes "
                            "hold GPU0 3.0 of 24.0 GiB") for s in p.reasons), p.reasons
    # the same machine idle plans at what was asked, with more context room
    idle = plan(T("2x3090-pcie-x8x8-nop2p"), M("llama-3.1-8b"), Policy())
    assert idle.gpu_memory_utilization == 0.9
    # one GPU alone is sized by its own room: GPU1 keeps 0.9
    one = plan(desk, M("llama-3.1-8b"), Policy(force_tp=1, force_pp=1, force_dp=1))
    assert one.gpus == (1,)
    assert one.gpu_memory_utilization == 0.9


def test_a_model_that_fits_only_without_the_desktop_says_so() -> None:
    with pytest.raises(PlanError) as refused:
        plan(T("2x3090-desktop-on-gpu0"), M(AWQ), Policy())
    assert "at --gpu-memory-utilization 0.85: other processes hold GPU0 3.0 of 24.0 GiB; with "\
        "that freed, 0.9 would give 21.6 GiB per GPU" in str(refused.value)
    plan(T("2x3090-pcie-x8x8-nop2p"), M(AWQ), Policy())  # which it does


def test_a_small_display_card_beside_two_3090s_is_left_out_and_named() -> None:
    p = plan(T("2x3090-gt1030-display"), M(AWQ), Policy())
    assert p.gpus == (0, 1)
    reasons = "\n".join(p.reasons)
    assert "not used by this plan: GPU2 (NVIDIA GeForce GT 1030)" in reasons
    # the two cards in use are one model: no claim that the display card slows them down
    assert "mixed GPU models" not in reasons
    # a layout rejected for the small card names the small card and its memory
    dp3 = next(r for r in p.reasons if r.startswith("rejected DP=3"))
    assert dp3.endswith("(0.9 × 2.0 GiB of NVIDIA GeForce GT 1030)"), dp3
    r = render(p, "m", served_name=None, host="127.0.0.1", port=8000)
    assert [e.env["CUDA_VISIBLE_DEVICES"] for e in r.engines] == ["0,1"]


@pytest.mark.parametrize(
    ("topo_name", "model_name", "env", "flag"),
    [
        ("2x3090-pcie-x8x8-nop2p", AWQ, {}, True),
        ("2x3090-nvlink-x8x8", AWQ, {}, False),
        ("2x3090-p2p-x16", AWQ, {"NCCL_P2P_LEVEL": "NODE", "VLLM_SKIP_P2P_CHECK": "0"}, False),
        ("4x4090-2socket", "qwen2.5-32b", {}, True),
        ("8xh100-nvswitch", "llama-3.3-70b", {}, False),
        ("h200x2-nvlink", "llama-3.3-70b", {}, False),
    ],
)
def test_link_settings(topo_name: str, model_name: str, env: dict[str, str], flag: bool) -> None:
    p = plan(T(topo_name), M(model_name), Policy())
    assert dict(p.env) == env
    assert p.settings.disable_custom_all_reduce == flag
    argv = render(p, "m", served_name=None, host="127.0.0.1", port=8000).argv
    assert ("--disable-custom-all-reduce" in argv) == flag
    if flag or env:
        assert any(k in r for r in p.reasons for k in [*env, "--disable-custom-all-reduce"])


# ---------------------------------------------------------------------------- errors


def test_a_model_that_cannot_fit_gives_the_numbers_and_what_would_fit() -> None:
    with pytest.raises(PlanError) as exc:
        plan(T("2x3090-nvlink-x8x8"), M("llama-3.3-70b"), Policy())
    msg = str(exc.value)
    assert "131.4 GiB of weights" in msg
    assert "has 21.6 GiB per GPU" in msg
    assert "4-bit AWQ/GPTQ variant" in msg
    assert "8 GPUs like these as TP=8" in msg
    assert exc.value.exit_code == 3


def test_a_context_too_long_for_memory_suggests_a_shorter_one() -> None:
    with pytest.raises(PlanError, match=r"--max-model-len \d+"):
        plan(T("2x3090-nvlink-x8x8"), M(AWQ), Policy(max_model_len=131072))


def test_context_beyond_the_model_is_refused() -> None:
    with pytest.raises(PlanError, match="max_position_embeddings 32768"):
        plan(T("h200x2-nvlink"), M("qwen2.5-32b"), Policy(max_model_len=65536))


def test_forcing_an_invalid_tp_reports_why() -> None:
    with pytest.raises(PlanError, match="not divisible by 3"):
        plan(T("3x3090-one-x4"), M(AWQ), Policy(force_tp=3))


def test_forced_sizes_are_kept() -> None:
    p = plan(T("h200x2-nvlink"), M("llama-3.3-70b"), Policy(force_pp=2))
    assert (p.tp, p.pp) == (1, 2)


# ------------------------------------------------------------------------------- CPU


def test_no_gpu_plans_the_cpu_engine(tiny_model_path: str) -> None:
    p = plan(Topology(gpus=()), load_model_spec(tiny_model_path), Policy())
    assert (p.engine, p.mode, p.tp, p.pp, p.dp, p.gpus) == ("cpu", "single", 1, 1, 1, ())
    assert "no GPU found: CPU engine, 1 replica" in p.reasons[0]
    r = render(p, tiny_model_path, served_name="tiny", host="127.0.0.1", port=9000)
    assert not any("gpu" in a for a in r.argv)
    assert r.argv[r.argv.index("--tensor-parallel-size") + 1] == "1"
    assert r.argv[r.argv.index("--pipeline-parallel-size") + 1] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in r.env


def test_plan_is_pure_and_repeatable() -> None:
    t, m = T("8xh100-nvswitch"), M("qwen2.5-32b")
    assert plan(t, m, Policy()) == plan(t, m, Policy())


def test_each_shape_on_8_gpus_is_a_candidate_once() -> None:
    p = plan(T("8xh100-nvswitch"), M("mistral-7b"), Policy())
    shapes = [(c.tp, c.pp, c.dp) for c in p.candidates]
    assert len(shapes) == len(set(shapes))
    assert all(a * b * c <= 8 for a, b, c in shapes)
    assert (8, 1, 1) in shapes  # the whole box as one TP group is among them


def test_every_pair_of_8_gpus_has_its_link_computed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[int, int]] = []
    real = costmodel.link_between

    def counted(t: Topology, a: Gpu, b: Gpu) -> Link:
        asked.append((a.index, b.index))
        return real(t, a, b)

    monkeypatch.setattr(costmodel, "link_between", counted)
    plan(T("8xh100-nvswitch"), M("mistral-7b"), Policy())
    pairs = [tuple(sorted(ab)) for ab in asked]
    assert len(pairs) == len(set(pairs)), "a pair's link was computed more than once"
    assert set(pairs) == set(itertools.combinations(range(8), 2))


def test_measured_h200_links_keep_the_nvlink_versus_shm_shape() -> None:
    # recorded by `probe --measure` on the lent 2 x H200, once as is and once with
    # NCCL_P2P_DISABLE=1 (NCCL then logged via SHM/direct/direct)
    m = M("llama-3.3-70b")
    nvl = load_topology(str(TOPOLOGY_DIR / "h200x2-measured.toposerve.json"), {})
    shm = load_topology(str(TOPOLOGY_DIR / "h200x2-p2p-disabled.toposerve.json"), {})
    assert nvl.pairs[0].measured is not None
    assert shm.pairs[0].measured is not None
    assert (nvl.pairs[0].measured.nccl_transport, shm.pairs[0].measured.nccl_transport) == (
        "nvlink",
        "shm",
    )
    a = plan(nvl, m, Policy(force_tp=2)).predicted
    b = plan(shm, m, Policy(force_tp=2)).predicted
    assert a.prefill_tok_s / b.prefill_tok_s > 1.3
    assert a.decode_tok_s / b.decode_tok_s == pytest.approx(1.0, abs=0.1)


def test_what_would_fit_names_each_option_with_the_context_it_gives() -> None:
    # the consumer case of issue 14: a 70B 4-bit model on 2 x 24 GB asked for its full context
    with pytest.raises(PlanError) as exc:
        plan(T("2x3090-nvlink-x8x8"), M(AWQ), Policy(max_model_len=131072))
    msg = str(exc.value)
    fp8_kv = re.search(r"FP8 KV cache \(`-- --kv-cache-dtype fp8`\)[^:]*: --max-model-len (\d+)",
                       msg)
    shorter = re.search(r"a shorter context, --max-model-len (\d+)", msg)
    assert fp8_kv
    assert shorter
    assert int(fp8_kv.group(1)) > int(shorter.group(1))  # half the bytes per token: longer
    # 40.3 GiB needed per 24 GB card with 18.5 GiB of weights on each: offloading every weight
    # still leaves the KV for 131,072 tokens too big, so no offload is offered
    assert "--cpu-offload-gb" not in msg
    # the fewest cards that hold it: 4 since vLLM's own accounting is modelled (issue 22)
    assert re.search(r"4 GPUs like these as TP=4: --max-model-len 131072", msg)


def test_fp8_weights_are_offered_with_their_context_when_bf16_does_not_fit() -> None:
    with pytest.raises(PlanError, match=r"FP8 weights \(~30.0 GiB: `-- --quantization fp8`\)"
                       r"[^:]*: --max-model-len \d+"):
        plan(T("2x3090-nvlink-x8x8"), M("gemma-4-31b"), Policy(max_model_len=262144))


def test_gemma4_is_served_with_vllms_gemma4_tool_parser() -> None:
    import importlib.util
    from pathlib import Path

    from launcher.engine.render import render

    p = plan(T("h200x2-nvlink"), M("gemma-4-31b"), Policy())
    assert p.family == "gemma4"
    argv = render(p, "gemma-4-31b", served_name=None, host="127.0.0.1", port=8000).argv
    assert argv[argv.index("--tool-call-parser") + 1] == "gemma4"
    # the installed vLLM registers a parser of that name (vllm/tool_parsers/__init__.py)
    spec = importlib.util.find_spec("vllm")
    assert spec is not None
    assert spec.origin is not None
    registry = Path(spec.origin).parent / "tool_parsers" / "__init__.py"
    assert '"gemma4": (' in registry.read_text()


def test_a_card_in_mig_mode_is_left_out_and_the_reason_named() -> None:
    p = plan(T("h200x2-gpu1-mig"), M("qwen3-32b"), Policy())
    assert p.gpus == (0,)
    assert any("GPU1 (NVIDIA H200, in MIG mode)" in r and "turn MIG off" in r
               for r in p.reasons), p.reasons
    assert plan(T("h200x2-nvlink"), M("qwen3-32b"), Policy(force_tp=2)).gpus == (0, 1)
    t = T("h200x2-gpu1-mig")
    all_mig = replace(t, gpus=tuple(replace(g, mig_enabled=True) for g in t.gpus))
    with pytest.raises(PlanError, match="every GPU is in MIG mode"):
        plan(all_mig, M("qwen3-32b"), Policy())


@pytest.mark.parametrize(("extra", "flags"), [
    ([], (2, False, 0.0)),
    (["--kv-cache-dtype", "fp8"], (1, False, 0.0)),
    (["--kv-cache-dtype=fp8_e5m2", "--enforce-eager"], (1, False, 0.0)),
    (["--kv-cache-dtype", "fp8", "--kv-cache-dtype", "auto"], (2, False, 0.0)),  # the last wins
    (["-q", "fp8"], (2, True, 0.0)),
    (["--quantization=fp8", "--cpu-offload-gb", "4"], (2, True, 4.0)),
])
def test_the_users_vllm_flags_that_change_memory_are_read(
        extra: list[str], flags: tuple[int, bool, float]) -> None:
    from launcher.cli.planopts import engine_memory_flags

    assert engine_memory_flags(extra) == flags


def test_an_unreadable_offload_is_one_line() -> None:
    from launcher.cli.planopts import engine_memory_flags

    with pytest.raises(PlanError, match="--cpu-offload-gb 'lots'"):
        engine_memory_flags(["--cpu-offload-gb", "lots"])


def test_what_the_refusal_suggests_plans_once_the_user_passes_it() -> None:
    # The planner says "Would fit: FP8 weights (`-- --quantization fp8`)"; with that flag the
    # same model on the same GPUs must then plan, not be refused again.
    t, m = T("2x3090-nvlink-x8x8"), M("qwen2.5-32b")
    with pytest.raises(PlanError, match="--quantization fp8"):
        plan(t, m, Policy())
    p = plan(t, m, Policy(fp8_weights=True))
    assert any("--quantization fp8 (your vLLM flag)" in r for r in p.reasons)
    # an FP8 KV cache holds twice the tokens: the context a KV-bound 70B gets grows
    awq = M(AWQ)
    base = plan(t, awq, Policy()).max_model_len
    fp8kv = plan(t, awq, Policy(kv_cache_bytes=1)).max_model_len
    assert 1.8 * base < fp8kv < 2.2 * base
    # weights kept in CPU memory leave their room to the KV cache
    assert plan(t, awq, Policy(cpu_offload_gib=4)).max_model_len > base


@settings(max_examples=200)
@given(extra=st.lists(st.sampled_from(["--kv-cache-dtype", "--quantization", "-q",
                                       "--cpu-offload-gb", "--enforce-eager", "fp8", "auto",
                                       "4", "-1", "nan", "inf", "x"])
                      | st.text(max_size=12), max_size=6))
def test_any_extra_vllm_flags_give_memory_settings_or_one_line(extra: list[str]) -> None:
    from launcher.cli.planopts import engine_memory_flags

    refusal = None
    try:
        kv, fp8, offload = engine_memory_flags(extra)
    except PlanError as exc:
        refusal = str(exc)
    if refusal is not None:
        assert "\n" not in refusal
        return
    assert kv in (1, 2)
    assert isinstance(fp8, bool)
    assert 0 <= offload < float("inf")
