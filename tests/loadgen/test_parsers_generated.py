"""The parsers this issue added, fed generated variants: never a traceback, always an answer
that says "unknown" when the input means nothing (metrics text, usage bodies, --context)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.agent import cache_counters
from loadgen.config import parse_context
from loadgen.errors import BadArgument
from loadgen.gpus import balance, readings
from loadgen.sse import classify

NAMES = st.sampled_from([
    "toposerve_gpu_utilization_ratio", "toposerve_gpu_power_watts", "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits", "other_metric", "",
])  # fmt: skip
LABELS = st.dictionaries(
    st.sampled_from(["gpu", "name", "engine", "x"]), st.text(max_size=6), max_size=3
)
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["NaN", "+Inf", "-1", "x", ""]),
)


@st.composite
def exposition(draw: st.DrawFn) -> str:
    """Prometheus text that is mostly well formed, sometimes not at all."""
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        name, labels, value = draw(NAMES), draw(LABELS), draw(VALUES)
        body = ",".join(f'{k}="{json.dumps(v)[1:-1]}"' for k, v in labels.items())
        lines.append(f"{name}{{{body}}} {value}" if labels else f"{name} {value}")
    if draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), draw(st.text(max_size=30)))
    return "\n".join(lines) + "\n"


@settings(max_examples=300, deadline=None)
@given(exposition())
def test_gpu_readings_and_balance_take_any_metrics_text(text: str) -> None:
    rows = readings(text)
    g = balance([text, text], 1.0)
    assert len(g.per_gpu) == len(rows)
    assert {f.gpu for f in g.flagged} <= {s.gpu for s in g.per_gpu}


@settings(max_examples=300, deadline=None)
@given(exposition())
def test_cache_counters_take_any_metrics_text(text: str) -> None:
    got = cache_counters(text)
    assert got is None or (isinstance(got.queries, float) and isinstance(got.hits, float))


JSONS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)  # fmt: skip
USAGE_KEYS = st.sampled_from(
    ["prompt_tokens", "completion_tokens", "prompt_tokens_details", "cached_tokens"]
)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(USAGE_KEYS, JSONS, max_size=4),
    st.one_of(st.none(), st.lists(st.dictionaries(st.sampled_from(["text", "delta"]), JSONS))),
)
def test_stream_events_with_any_usage_or_choices_classify_without_error(
    usage: dict[str, Any], choices: Any
) -> None:
    chunk = classify(json.dumps({"choices": choices, "usage": usage}).encode())
    if chunk.usage is not None:
        assert chunk.usage.prompt_tokens >= 0
        assert chunk.usage.completion_tokens >= 0
        assert chunk.usage.cached_tokens is None or chunk.usage.cached_tokens >= 0
    assert isinstance(chunk.text, str)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=20))
def test_context_takes_first_last_or_gives_a_one_line_error(text: str) -> None:
    message = ""
    try:
        first, last = parse_context(text)
    except BadArgument as exc:
        message = str(exc)
    if message:
        assert "\n" not in message
        assert "FIRST:LAST" in message
    else:
        assert isinstance(first, int)
        assert isinstance(last, int)


@pytest.mark.parametrize(("text", "pair"), [("2000:30000", (2000, 30000)), ("512", (512, 512))])
def test_context_examples(text: str, pair: tuple[int, int]) -> None:
    assert parse_context(text) == pair
