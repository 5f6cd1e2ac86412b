"""The planner's CPU-engine prediction against the real vLLM CPU engine serving the tiny model."""

from __future__ import annotations

import os
import random
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from launcher.model.modelspec import load_model_spec
from launcher.model.tinymodel import ensure_tiny_model
from launcher.pipeline import enginesteps
from launcher.planner.plan import Policy, plan
from launcher.probe import enginestep
from launcher.probe.topology import Topology


def itl_totals(url: str) -> tuple[float, float]:
    """vLLM's own inter-token latency histogram (sum, count), summed over its label sets."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for key in total:
            if line.startswith(f"vllm:inter_token_latency_seconds_{key}{{"):
                total[key] += float(line.rsplit(" ", 1)[1])
    return total["sum"], total["count"]


def engine_decode_tok_s(url: str, model: str, prompt: str, tokens: int,
                        headers: dict[str, str]) -> float:
    """Decode speed as the engine timed it: immune to when this (shared, busy) client got to
    read the stream, which once made a client-side figure read 40,000 tok/s."""
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "min_tokens": tokens,
            "ignore_eos": True}
    before = itl_totals(url)
    httpx.post(f"{url}/v1/completions", json=body, timeout=120, headers=headers).raise_for_status()
    after = itl_totals(url)
    gaps = after[1] - before[1]
    assert gaps >= tokens - 1
    return gaps / (after[0] - before[0])


@pytest.fixture(scope="module")
def timed_step(stack: Any) -> Iterator[tuple[Topology, float]]:
    """`probe --measure`'s engine step, timed by the pipeline as the command does (its own
    offline vLLM engine on the same embedded model), read back the way `plan` reads it; and
    the step it kept. The record is removed afterwards so that no other test plans with it."""
    cache = Path(stack.model_path).parent.parent  # the cache the stack's model came from
    env = {**os.environ, "TOPOSERVE_CACHE": str(cache)}
    line = enginesteps.measure(env)
    assert "kept in" in line, line
    try:
        topo = enginesteps.attach(Topology(gpus=(), source="nvml"), env)
        assert topo.engine_step is not None, "plan does not find what probe --measure kept"
        yield topo, topo.engine_step.step_s
    finally:
        enginestep.cache_path(cache, enginesteps.key_here(env)).unlink(missing_ok=True)


@pytest.mark.stack
def test_cpu_decode_prediction_from_the_timed_engine_step_is_within_a_factor_of_two(
    stack: Any, timed_step: tuple[Topology, float]
) -> None:
    """The plan's decode speed on the CPU engine against the served engine's, both on this
    machine within a minute: the plan adds the roofline's arithmetic to the engine step
    `probe --measure` timed here, so it follows the machine (a fixed constant was off by 2.6x
    on the same machine a day later). The band is wide because both are timed on a shared
    2-core machine whose other work moves a step by 1.5x within minutes (seen while other
    tests ran beside it: 8.2 ms timed, 14 ms served); #22 asks for 25%."""
    topo, _ = timed_step
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    measured = statistics.median(  # as loadgen reports it: the middle of a few runs
        engine_decode_tok_s(stack.vllm_url, stack.model, " ".join(rng.choices(words, k=200)), 64,
                            stack.engine_headers)
        for _ in range(3)
    )
    p = plan(topo, load_model_spec(stack.model_path), Policy(cpu_cores=os.cpu_count() or 1))
    assert any("timed on this machine" in r for r in p.reasons), p.reasons
    assert 0.5 < p.predicted.decode_tok_s / measured < 2.0, (p.predicted.decode_tok_s, measured)


def test_without_a_timed_step_the_plan_says_the_step_is_assumed() -> None:
    p = plan(Topology(gpus=()), load_model_spec(str(ensure_tiny_model())), Policy(cpu_cores=2))
    assert any("engine step overhead assumed" in r for r in p.reasons), p.reasons
