"""The LM head runs per sampled position, the embedding is a lookup (issue 22).

vLLM computes logits only at its ``logits_indices``: one row per running sequence that samples
in a step; a chunk of a prompt that is not its last samples nothing. The input embedding reads a
row per token and multiplies nothing. Every path of the cost model charges the layers' matmuls
per token and the LM head per sampled position (costmodel.forward_flops): the roofline's
prefill, chunked prefill, decode, the simulations' steps and the CPU engine's prediction; the
kernel-table path times the head per sampled row.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.planner import agent, costmodel
from launcher.planner.hardware import CPU_GFLOPS_PER_CORE
from launcher.planner.loadsim import RooflineStep
from launcher.planner.schedsim import StepBatch
from tests.launcher.gpushapes import one_gpu, spec

# a step whose arithmetic far outweighs the per-layer launch floor on an H200
BIG_CHUNK = 8192


def test_a_152k_vocab_untied_shape_charges_its_tables_to_no_prompt_token() -> None:
    m = spec("qwen2.5-7b-shape")
    assert not m.tied_embeddings
    assert m.vocab_size == 152_064
    tables = 2 * m.vocab_size * m.hidden_size  # the input embedding and the LM head
    assert m.token_params == m.active_params - tables
    share = tables / m.active_params
    assert 0.13 < share < 0.15  # what every prompt token used to be charged for nothing
    # a 512-token prompt: its layers per token and one LM-head row
    assert costmodel.forward_flops(m, 512, 1) == pytest.approx(
        2.0 * (m.active_params * 512) * (1 - share) + 2.0 * m.lm_head_params)
    assert costmodel.forward_flops(m, 512, 1) < 0.87 * 2.0 * m.active_params * 512


def test_a_prompt_chunk_that_samples_nothing_charges_no_lm_head() -> None:
    m = spec("qwen2.5-7b-shape")
    lay = one_gpu(m)
    rate = costmodel._prefill_flops_s([g for st in lay.stages for g in st])
    last = costmodel.prefill_step_s(m, lay, BIG_CHUNK)  # one sequence: it samples
    middle = costmodel.prefill_step_s(m, lay, BIG_CHUNK, sampled=0)
    assert last - middle == pytest.approx(2.0 * m.lm_head_params / rate, rel=1e-6)
    # a prompt of two chunks samples once, at its end
    two = costmodel.prefill_at_depth_s(m, lay, 2 * BIG_CHUNK, 0, BIG_CHUNK)
    assert two == pytest.approx(
        costmodel.prefill_step_s(m, lay, BIG_CHUNK, sampled=0)
        + costmodel.prefill_step_s(m, lay, BIG_CHUNK, depth=BIG_CHUNK), rel=1e-9)


def test_a_bigger_vocabulary_leaves_a_non_sampling_chunks_arithmetic_alone() -> None:
    """Twice the vocabulary (two tables twice as large) changes the weights read, not the
    arithmetic of a chunk that samples nothing; before, every token paid both tables."""
    m = spec("qwen2.5-7b-shape")
    table = m.vocab_size * m.hidden_size
    wide = replace(m, vocab_size=2 * m.vocab_size, embedding_params=2 * table,
                   active_params=m.active_params + 2 * table, params=m.params + 2 * table)
    assert wide.token_params == m.token_params
    assert costmodel.forward_flops(wide, BIG_CHUNK, 0) == costmodel.forward_flops(m, BIG_CHUNK, 0)


def test_the_simulations_charge_the_head_for_the_sequences_that_sample() -> None:
    m = spec("qwen2.5-7b-shape")
    lay = one_gpu(m)
    rate = costmodel._prefill_flops_s([g for st in lay.stages for g in st])
    chunk = StepBatch(prefill_tokens=BIG_CHUNK, prefill_pairs=BIG_CHUNK * 4096.0, sampled=0)
    ends = replace(chunk, sampled=1)
    for timer in (RooflineStep(m, lay), agent.RooflineStep(m, lay)):
        assert timer.step_s(ends) - timer.step_s(chunk) == pytest.approx(
            2.0 * m.lm_head_params / rate, rel=1e-3)


def test_the_cpu_prediction_charges_the_layers_per_prompt_token() -> None:
    m = spec("qwen2.5-7b-shape")
    cores = 8
    rate = cores * CPU_GFLOPS_PER_CORE * 1e9
    p = costmodel.predict_cpu(m, cores, prompt=512, gen=16, concurrency=1, step_overhead_s=0.0)
    assert p.ttft_s == pytest.approx(costmodel.forward_flops(m, 512, 1) / rate)
    assert p.ttft_s < 0.87 * 2.0 * m.active_params * 512 / rate
