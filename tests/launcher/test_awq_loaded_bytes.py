"""What vLLM holds of a 4-bit AWQ checkpoint once loaded, against every logged AWQ start.

vLLM repacks an AWQ checkpoint's linear layers for Machete on Hopper, whose zero points are 16
bits (-scale x zero) where the checkpoint packs them in 4, and the repacking's tensors land in
blocks PyTorch's caching allocator does not split (quantization.awq_load_growth). The logged
figures are vLLM 0.26's "Model loading took" (tests/fixtures/vllm-awq-loading.txt), read by the
planner as memfit.weights_per_gpu.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.model import quantization
from launcher.model.modelspec import (
    GIB,
    load_model_spec,
    sized_by_checkpoint,
    spec_from_config,
    weight_bytes_on,
)
from launcher.planner import costmodel, memfit
from launcher.probe.topology import load_topology
from tests.launcher.paths import REPO, topo

FIXTURE = REPO / "tests" / "fixtures" / "vllm-awq-loading.txt"
MODELS = REPO / "benchmarks" / "gpu" / "models"
WITHIN = 0.01


@dataclass(frozen=True)
class Start:
    model: str
    loaded: float  # GiB, as the log prints it
    log: str


def starts() -> list[Start]:
    out = []
    for line in FIXTURE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            model, loaded, log = line.split()
            out.append(Start(model, float(loaded), log))
    return out


STARTS = starts()


def test_the_fixture_holds_every_awq_family_logged() -> None:
    assert {s.model for s in STARTS} == {
        "llama-3.1-8b-awq-shape", "llama-3.3-70b-awq-shape", "qwen2.5-14b-awq-shape",
        "qwen2.5-32b-awq-shape", "qwen3-14b-awq-shape", "qwen3-32b-awq-shape"}


@pytest.mark.parametrize("s", STARTS, ids=[s.log.split("/")[4] + "/" + s.model for s in STARTS])
def test_each_figure_is_the_one_its_log_printed(s: Start) -> None:
    text = (REPO / s.log).read_text(errors="replace")
    assert f"Model loading took {s.loaded:g} GiB" in text
    assert "Using MacheteLinearKernel for AutoAWQMarlinLinearMethod" in text


@pytest.mark.parametrize("s", STARTS, ids=[s.log.split("/")[4] + "/" + s.model for s in STARTS])
def test_planned_weights_are_within_1_percent_of_what_vllm_loaded(s: Start) -> None:
    m = load_model_spec(str(MODELS / s.model))
    planned = memfit.weights_per_gpu(m, 1, 1) / GIB
    assert planned == pytest.approx(s.loaded, rel=WITHIN), f"{s.model}: {planned:.3f} GiB"


@pytest.mark.parametrize("s", STARTS, ids=[s.log.split("/")[4] + "/" + s.model for s in STARTS])
def test_the_checkpoints_own_bytes_fall_short_of_every_load(s: Start) -> None:
    # without the repacking's growth the estimate was 0.19-2.6% under (Machete's zero points
    # alone: 70B 34.03 for 34.09, Qwen3-14B 6.63 for 6.80) and 2.4-4.7% with neither
    m = load_model_spec(str(MODELS / s.model))
    stored = dataclasses.replace(m, weight_bytes=m.weight_bytes - m.load_growth_bytes)
    assert memfit.weights_per_gpu(stored, 1, 1) / GIB < s.loaded * (1 - 0.02)
    assert m.load_growth_bytes > 0


def test_a_real_checkpoints_size_is_raised_by_the_same_growth() -> None:
    m = load_model_spec(str(MODELS / "qwen3-14b-awq-shape"))
    cfg = json.loads((MODELS / "qwen3-14b-awq-shape" / "config.json").read_text())
    total = 7 * GIB
    assert sized_by_checkpoint(m, cfg, total).weight_bytes == total + m.load_growth_bytes


def _config(**quant: object) -> dict[str, object]:
    cfg = json.loads((MODELS / "qwen3-14b-awq-shape" / "config.json").read_text())
    return {**cfg, "quantization_config": {**cfg["quantization_config"], **quant}}


def test_zero_points_grow_by_three_halves_of_a_byte_a_group_and_column() -> None:
    # 13.2B linear weights in groups of 128: 1.5 / 128 bytes each beyond the packed zeros
    m = spec_from_config(_config(), "q")
    zeros = 40 * sum(-(-k // 128) * n * 1.5 for k, n in
                     ((5120, 7168), (5120, 5120), (5120, 34816), (17408, 5120)))
    assert zeros <= m.load_growth_bytes <= zeros + 40 * 8 * quantization.ALLOCATOR_SPLIT_BYTES


def test_checkpoints_machete_does_not_repack_keep_their_bytes() -> None:
    assert spec_from_config(_config(zero_point=False), "q").load_growth_bytes == 0
    assert spec_from_config(_config(group_size=32), "q").load_growth_bytes == 0
    assert spec_from_config(_config(bits=8), "q").load_growth_bytes == 0  # vLLM: 4 bits alone
    gptq = _config(quant_method="gptq", sym=False)
    assert spec_from_config(gptq, "q").load_growth_bytes == 0
    # Marlin runs a layer whose features are not Machete's tile multiples: no growth from it
    assert quantization.awq_load_growth({(5120 + 32, 5120): 40}, 128, 4.0).total == 0


def test_a_marlin_card_holds_the_zero_points_packed_as_the_checkpoint_does() -> None:
    # an RTX 3090 (8.6) runs Marlin: the 70B's 0.75 GiB of 16-bit zero points are Hopper's only
    m = load_model_spec(str(MODELS / "llama-3.3-70b-awq-shape"))
    assert m.machete_zero_bytes / GIB == pytest.approx(0.747, abs=0.001)
    assert weight_bytes_on(m, (9, 0)) == m.weight_bytes
    assert weight_bytes_on(m, (8, 6)) == m.weight_bytes - m.machete_zero_bytes
    assert weight_bytes_on(m, (8, 6)) > m.weight_bytes - m.load_growth_bytes


def test_a_card_of_unknown_compute_capability_is_sized_at_the_larger_layout() -> None:
    # one rule (weight_bytes_on) for every caller: a card that may be a Hopper holds Machete's
    # zero points as far as a memory fit is concerned, alone or beside a Marlin card
    m = load_model_spec(str(MODELS / "llama-3.3-70b-awq-shape"))
    assert m.machete_zero_bytes > 0
    assert weight_bytes_on(m, None) == weight_bytes_on(m, (9, 0)) == m.weight_bytes
    ampere = load_topology(topo("2x3090-nvlink-x8x8"), {}).gpus[0]
    unknown = dataclasses.replace(ampere, cc=None)
    assert memfit.held_weight_bytes(m, (ampere, unknown)) == weight_bytes_on(m, None)
    assert memfit.held_weight_bytes(m) == weight_bytes_on(m, None)


def test_a_plan_on_marlin_cards_keeps_the_context_hoppers_zero_points_would_take() -> None:
    """memfit sizes the weights the layout's cards hold (memfit.held_weight_bytes): two RTX
    3090s give the 70B AWQ's zero points no room, so their KV budget is that much larger than
    Hopper's layout would leave; a layout with a Hopper card in it, or a card whose compute
    capability is unknown, is sized at Hopper's, the larger."""
    m = load_model_spec(str(MODELS / "llama-3.3-70b-awq-shape"))
    ampere = load_topology(topo("2x3090-nvlink-x8x8"), {}).gpus
    hopper = load_topology(topo("8xh100-nvswitch"), {}).gpus[:2]
    assert all(g.cc == (8, 6) for g in ampere)
    assert memfit.held_weight_bytes(m, ampere) == m.weight_bytes - m.machete_zero_bytes
    assert memfit.held_weight_bytes(m, hopper) == m.weight_bytes
    assert memfit.held_weight_bytes(m, (ampere[0], hopper[0])) == m.weight_bytes
    assert memfit.held_weight_bytes(m, (dataclasses.replace(ampere[0], cc=None),)) == m.weight_bytes
    assert memfit.held_weight_bytes(m) == m.weight_bytes
    on_3090 = memfit.fit(m, ampere, 2, 1, 0.9)
    as_hopper = memfit.weights_per_gpu(m, 2, 1, hopper)
    assert on_3090.weights == pytest.approx(as_hopper - m.machete_zero_bytes / 2)
    assert on_3090.kv_budget > 0


def test_the_repackings_allocator_slack_is_held_but_never_read() -> None:
    """Of what the repacking adds only the zero points are read by a step: the allocator's
    slack counts in the memory (weight_bytes) and not in the bytes a forward pass streams."""
    m = load_model_spec(str(MODELS / "llama-3.3-70b-awq-shape"))
    slack = m.load_growth_bytes - m.machete_zero_bytes
    assert slack > 0
    # the same model held without the slack: its growth the zero points alone
    bare = dataclasses.replace(m, weight_bytes=m.weight_bytes - slack,
                               load_growth_bytes=m.machete_zero_bytes)
    assert costmodel.streamed_weight_bytes(m) == costmodel.streamed_weight_bytes(bare)


def test_a_mixture_of_experts_is_not_sized_as_dense_layers() -> None:
    cfg = json.loads((MODELS / "qwen3-30b-a3b-shape" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128,
                                  "zero_point": True}
    assert spec_from_config(cfg, "moe").load_growth_bytes == 0


DIMS = st.integers(1, 64).map(lambda x: x * 128)


@given(st.dictionaries(st.tuples(DIMS, DIMS), st.integers(1, 96), min_size=1, max_size=4),
       st.sampled_from([-1, 64, 128]), st.sampled_from([2.0, 3.0, 4.0, 8.0]))
def test_growth_is_the_zero_points_widening_plus_at_most_a_split_threshold_per_tensor(
        matrices: dict[tuple[int, int], int], group: int, bits: float) -> None:
    growth = quantization.awq_load_growth(matrices, group, bits).total
    widening = sum(count * (1 if group == -1 else -(-k // group)) * n * (2 - bits / 8)
                   for (k, n), count in matrices.items())
    tensors = 2 * sum(matrices.values())
    assert widening - 1 <= growth <= widening + tensors * quantization.ALLOCATOR_SPLIT_BYTES
    doubled = quantization.awq_load_growth({s: 2 * c for s, c in matrices.items()}, group,
                                           bits).total
    assert abs(doubled - 2 * growth) <= 2  # a layer's growth is its own: twice the layers, twice
