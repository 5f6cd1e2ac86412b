"""The planner's CPU-engine prediction against the real vLLM CPU engine serving the tiny model."""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import httpx
import pytest

from launcher.modelspec import load_model_spec
from launcher.plan import Policy, plan
from launcher.topology import Topology


def stream_decode_tok_s(url: str, model: str, prompt: str, tokens: int) -> float:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    stamps: list[float] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk: dict[str, Any] = json.loads(line[6:])
                if chunk.get("choices"):
                    stamps.append(time.perf_counter())
    assert len(stamps) >= tokens // 2
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


@pytest.mark.stack
def test_cpu_decode_prediction_is_within_a_factor_of_two(stack: Any) -> None:
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    measured = max(  # the best of three: the machine is shared, slowdowns are not the engine's
        stream_decode_tok_s(stack.vllm_url, stack.model, " ".join(rng.choices(words, k=200)), 64)
        for _ in range(3)
    )
    p = plan(
        Topology(gpus=()), load_model_spec(stack.model_path), Policy(cpu_cores=os.cpu_count() or 1)
    )
    assert 0.5 < p.predicted.decode_tok_s / measured < 2.0, (p.predicted.decode_tok_s, measured)
