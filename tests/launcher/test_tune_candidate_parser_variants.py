"""`launcher tune --candidate SPEC`, fed generated specs: each is a candidate or one
LauncherError line, never a traceback (an unclosed quote and a non-ASCII digit were both
tracebacks: shlex's ValueError, and int() of a digit str.isdigit() takes)."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.errors import LauncherError
from launcher.tune.loop import parse_candidate

WORDS = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["tp", "pp", "dp", "name", "x", ""]),
              st.one_of(st.integers(-2, 16).map(str), st.text(max_size=4),
                        st.sampled_from(["²", "٣", "0x2", " 2"]))),
    st.sampled_from(["--max-num-seqs", "8", "--kv-cache-dtype", "fp8", "'", '"', "\\", "--"]),
    st.text(max_size=6),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(WORDS, max_size=5).map(" ".join))
def test_any_candidate_spec_is_a_candidate_or_one_line(text: str) -> None:
    try:
        spec = parse_candidate(text)
    except LauncherError as exc:
        message = str(exc)
        assert message.startswith("candidate ")
        assert "\n" not in message.replace(repr(text), "")
        return
    assert spec.name
    for n in (spec.tp, spec.pp, spec.dp):
        assert n is None or n >= 1
    assert all(a in shlex.split(text) for a in spec.vllm_args)


@pytest.mark.parametrize("text", ['name="my model', "tp=2 --flag \\", "tp=²"])
def test_a_spec_that_was_a_traceback_is_one_line(text: str) -> None:
    with pytest.raises(LauncherError, match="candidate"):
        parse_candidate(text)
