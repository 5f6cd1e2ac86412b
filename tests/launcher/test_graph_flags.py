"""The CUDA-graph range a plan's kernel-table prediction uses, read from the user's vLLM flags."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.cli.planopts import engine_graph_tokens
from launcher.planner.plantypes import Policy


@pytest.mark.parametrize(
    ("flags", "tokens"),
    [
        ([], None),
        (["--enforce-eager"], 0),
        (["--compilation-config", '{"cudagraph_capture_sizes":[1,2,4,8,16,32,64]}'], 64),
        (["--compilation-config={\"cudagraph_capture_sizes\":[8,256,32]}"], 256),
        (["-O", '{"max_cudagraph_capture_size": 128}'], 128),
        (["-O", '{"cudagraph_mode": "NONE", "cudagraph_capture_sizes": [1, 2]}'], 0),
        (["-O.cudagraph_capture_sizes=[1,2,4,16]"], 16),
        (["-O.max_cudagraph_capture_size=96"], 96),
        (["--cuda-graph-sizes", "1", "2", "48", "--max-num-seqs", "8"], 48),
        (["--compilation-config", "{not json"], None),
        (["--compilation-config", '{"cudagraph_capture_sizes": ["lots"]}'], None),
        (["--compilation-config", '{"max_cudagraph_capture_size": true}'], None),
        (["--compilation-config", "3"], None),  # an optimisation level, no range
    ],
)
def test_the_graph_range_is_read_from_the_flags_vllm_takes(flags: list[str],
                                                           tokens: int | None) -> None:
    assert engine_graph_tokens(flags) == tokens


def test_without_flags_the_plan_assumes_vllms_default_capture_range() -> None:
    assert Policy().graph_steps == 512  # min(2 x 256 sequences, 512)
    assert Policy(max_num_seqs=16).graph_steps == 32
    assert Policy(graph_tokens=64).graph_steps == 64
    assert Policy(graph_tokens=0).graph_steps == 0


VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                      lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=30), c,
                                                                          max_size=4),
                      max_leaves=10)
FLAG_WORDS = st.sampled_from(["--compilation-config", "-O", "--cuda-graph-sizes",
                              "--enforce-eager", "-O.cudagraph_capture_sizes=",
                              "-O.max_cudagraph_capture_size=", "-O.cudagraph_mode="])


@given(st.lists(FLAG_WORDS | st.text(max_size=12) | VALUES.map(json.dumps), max_size=8))
def test_any_flags_give_a_graph_range_or_vllms_default(flags: list[str]) -> None:
    got = engine_graph_tokens(flags)
    assert got is None or (isinstance(got, int) and 0 <= got <= 1 << 20)
