"""A multimodal model's vision tower runs per image, not per text token (issue 22).

vLLM runs a vision tower (and its projector) on the images a request carries; a text step's
matmuls never pass through it. The planner counts the tower in the weights a GPU holds, but
charges neither its arithmetic to a prompt token nor its bytes to a decode step's weight read.
Sized with the real Hugging Face code (Gemma 3's SigLIP tower, ~0.4B of the 27B).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from launcher.model.modelspec import spec_from_config
from launcher.planner import costmodel
from launcher.planner.memfit import tower_bytes

GEMMA3 = Path(__file__).parent.parent / "fixtures" / "models" / "gemma-3-27b" / "config.json"


def _configs() -> tuple[dict[str, object], dict[str, object]]:
    full = json.loads(GEMMA3.read_text())
    smaller = copy.deepcopy(full)
    vision = smaller["vision_config"]
    vision["num_hidden_layers"] = max(1, vision.get("num_hidden_layers", 27) // 3)
    return full, smaller


def test_a_vision_tower_is_held_in_memory_but_charged_to_no_text_token() -> None:
    full_cfg, smaller_cfg = _configs()
    full = spec_from_config(full_cfg, "gemma-3-27b")
    smaller = spec_from_config(smaller_cfg, "gemma-3-27b-small-tower")
    assert 0.3e9 < full.tower_params < 0.6e9  # SigLIP-so400m
    assert full.tower_params > smaller.tower_params > 0
    # the memory the GPU holds grows with the tower ...
    assert full.weight_bytes - smaller.weight_bytes == pytest.approx(
        tower_bytes(full) - tower_bytes(smaller), rel=1e-6)
    # ... a text token's arithmetic and a decode step's weight read do not
    assert full.token_params == smaller.token_params
    assert costmodel.forward_flops(full, 512, 1) == costmodel.forward_flops(smaller, 512, 1)
    assert costmodel.streamed_weight_bytes(full) == pytest.approx(
        costmodel.streamed_weight_bytes(smaller), rel=1e-9)


def test_a_text_only_model_has_no_tower() -> None:
    full_cfg, _ = _configs()
    text = dict(full_cfg["text_config"])  # type: ignore[arg-type]
    text.setdefault("model_type", "gemma3_text")
    text["architectures"] = ["Gemma3ForCausalLM"]
    m = spec_from_config(text, "gemma-3-27b-text")
    assert m.tower_params == 0
    assert tower_bytes(m) == 0
