"""An eager prefill layer's host cost comes from the kernels the served engine's layer launches,
per family (issue 22): the family registry's counts (families.eager_layer_kernels) are the
installed vLLM's own, counted by launcher.probe.layerops from its model classes, and
costmodel.eager_host_layer_s charges a layer by them."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.model import families
from launcher.model.modelspec import load_model_spec
from launcher.planner import costmodel
from launcher.planner.hardware import (
    EAGER_HOST_LAYER_S,
    KERNEL_LAUNCH_S,
    MOE_LAYER_PREFILL_S,
    PIECEWISE_HOST_SHARE,
    SERVER_HOST,
)
from launcher.probe import layerops
from tests.launcher.paths import REPO
from tests.support import early

MODELS = REPO / "benchmarks" / "gpu" / "models"
# one shape of each family the registry gives a count for (its dense decoder layer)
SHAPES = ("llama-3.1-8b-longctx-shape", "mistral-nemo-12b-shape", "qwen2.5-14b-shape",
          "qwen3-32b-shape", "gemma-2-9b-shape", "gemma-3-27b-shape", "deepseek-v2-lite-shape",
          "glm-4.7-flash-shape", "granite-3.3-8b-shape")
# vLLM 0.32's Llama layer as launcher.probe.layerops records it on the CPU
LLAMA_OPS = ("vllm_ir.fused_add_rms_norm", "_C.onednn_mm", "_C.rotary_embedding",
             "vllm.unified_kv_cache_update", "vllm.unified_attention_with_output",
             "_C.onednn_mm", "vllm_ir.fused_add_rms_norm", "_C.onednn_mm", "aten.silu",
             "aten.mul", "_C.onednn_mm")


def begin_count(tmp: Path) -> dict[str, layerops.LayerOps]:
    """Each shape's dense layer, counted in one process that imports vLLM (~30 s on two cores):
    begun in the background at collection, beside the pure tests (tests/support/early.py)."""
    # files, not pipes: nobody reads a pipe while this waits
    with (tmp / "count.out").open("wb") as so, (tmp / "count.err").open("wb") as se:
        proc = subprocess.Popen([sys.executable, "-m", "launcher.probe.layerops",
                                 *(str(MODELS / s) for s in SHAPES)],
                                stdout=so, stderr=se, cwd=REPO, env=early.environ())
    early.wait_exit(proc, 600, "launcher.probe.layerops", poll_s=0.5)
    stderr = (tmp / "count.err").read_text(errors="replace")
    assert proc.returncode == 0, stderr[-3000:]
    out: dict[str, layerops.LayerOps] = {}
    for line in (tmp / "count.out").read_text().splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            rec = layerops.LayerOps(**{**d, "ops": tuple(d["ops"])})
            if not rec.moe:
                out.setdefault(Path(rec.folder).name, rec)
    return out


early.register(__file__, "counted", begin_count, lambda _: None, holds=False)


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, layerops.LayerOps]:
    pytest.importorskip("vllm")
    got: dict[str, layerops.LayerOps] = early.take(__file__, "counted", tmp_path_factory)
    return got


@pytest.mark.parametrize("shape", SHAPES)
def test_registry_kernel_count_is_the_installed_vllms_layer(
        counted: dict[str, layerops.LayerOps], shape: str) -> None:
    rec = counted[shape]
    family = families.family_name(rec.model_type)
    assert families.eager_layer_kernels(family) == rec.kernels, (
        f"{shape} ({family}): registry {families.eager_layer_kernels(family)}, vLLM's layer "
        f"{rec.kernels}: {rec.ops}")


def test_kernel_rule_fuses_element_wise_runs_between_gemms_and_split_ops() -> None:
    # 4 GEMMs, the KV-cache write and the attention, and 4 fused runs (norm, rotary, norm,
    # activation)
    assert layerops.kernels(LLAMA_OPS) == 10
    # a norm, a residual add and a second norm between two GEMMs are one kernel
    assert layerops.kernels(("_C.onednn_mm", "aten.add", "vllm_ir.rms_norm", "aten.add",
                             "vllm_ir.fused_add_rms_norm", "_C.onednn_mm")) == 3
    assert layerops.classify("aten.view") == "free"
    assert layerops.classify("aten.topk") == "opaque"
    assert layerops.classify("vllm.unified_attention_with_output") == "opaque"
    assert layerops.classify("_C.rotary_embedding") == "fusible"


def test_a_piecewise_layer_replays_one_piece_beside_its_two_attention_ops() -> None:
    # vLLM's split_graph keeps the consecutive KV-cache write and attention together, and the
    # run after the attention goes on into the next layer up to its KV-cache write: one piece
    assert layerops.piecewise_dispatches(LLAMA_OPS) == 3
    # the host's share of an eager layer that a piecewise layer keeps is that count over the
    # eager layer's dispatches (its kernels, the two ops among them)
    share = layerops.piecewise_dispatches(LLAMA_OPS) / layerops.kernels(LLAMA_OPS)
    assert share == pytest.approx(PIECEWISE_HOST_SHARE)
    write = LLAMA_OPS.index("vllm.unified_kv_cache_update") + 1
    # device work between the two ops would be a piece of its own; a view or an allocation not
    between = (*LLAMA_OPS[:write], "aten.add", *LLAMA_OPS[write:])
    assert layerops.piecewise_dispatches(between) == 4
    viewed = (*LLAMA_OPS[:write], "aten.view", "aten.empty", *LLAMA_OPS[write:])
    assert layerops.piecewise_dispatches(viewed) == 3
    # the latent attention's ops split alike; a layer with no splitting op is one piece
    mla = tuple(op.replace("unified_", "unified_mla_") for op in LLAMA_OPS)
    assert layerops.piecewise_dispatches(mla) == 3
    assert layerops.piecewise_dispatches(("aten.mm", "aten.add", "aten.mm")) == 1


def test_eager_host_layer_charges_the_kernels_beyond_the_llama_layers() -> None:
    llama = load_model_spec(str(MODELS / "llama-3.1-8b-longctx-shape"))
    nemo = load_model_spec(str(MODELS / "mistral-nemo-12b-shape"))
    gemma2 = load_model_spec(str(MODELS / "gemma-2-9b-shape"))
    # the reference layer (and Mistral's, the same layer) keeps the shipped, fitted figure
    assert costmodel.eager_host_layer_s(llama, SERVER_HOST) == pytest.approx(EAGER_HOST_LAYER_S)
    assert costmodel.eager_host_layer_s(nemo, SERVER_HOST) == pytest.approx(EAGER_HOST_LAYER_S)
    more = families.eager_layer_kernels("gemma2") - families.eager_layer_kernels("llama")
    assert more > 0
    assert costmodel.eager_host_layer_s(gemma2, SERVER_HOST) == pytest.approx(
        EAGER_HOST_LAYER_S + more * KERNEL_LAUNCH_S)
    # a host twice as slow launches every kernel twice as slowly
    slow = replace(SERVER_HOST, layer_launch_s=2 * SERVER_HOST.layer_launch_s)
    assert costmodel.eager_host_layer_s(gemma2, slow) == pytest.approx(
        2 * costmodel.eager_host_layer_s(gemma2, SERVER_HOST))


def test_deepseek_layer_keeps_its_recorded_three_milliseconds() -> None:
    # the family's extra was FITTED to DeepSeek-V2-Lite's 3.0 ms a layer on the lent H200;
    # its two kernels more than the Llama layer's add 14 us, within that record's 1%
    m = load_model_spec(str(MODELS / "deepseek-v2-lite-shape"))
    assert costmodel.eager_host_layer_s(m, SERVER_HOST) == pytest.approx(3.0e-3, rel=0.01)
    assert costmodel.eager_host_layer_s(m, SERVER_HOST) > MOE_LAYER_PREFILL_S + EAGER_HOST_LAYER_S


def test_unknown_family_is_charged_the_reference_layer() -> None:
    assert families.eager_layer_kernels("no-such-family") == families.REFERENCE_LAYER_KERNELS
