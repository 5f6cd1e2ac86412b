"""Files a user hands the launcher as its own JSON: the saved plan (`serve --plan FILE`) and
the JSON of a vLLM flag the launcher merges its settings into (--compilation-config). Any bytes,
nesting past Python's recursion limit included, are a plan or one LauncherError line, and (the
flag) the user's object with the launcher's settings merged in, or one line that says what to
pass (read as {}, the user's settings were silently replaced by ours); never a traceback."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from launcher.engine.enginecmd import COMPILATION_CONFIG, _merge_json_flag
from launcher.errors import EngineError, LauncherError
from launcher.pipeline.run import read_plan_file

DEEP = st.sampled_from([b"[" * 100_000, b'{"a":' * 100_000])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=10,
)
CONTENT = st.one_of(st.binary(max_size=40), DEEP, JSON.map(lambda v: json.dumps(v).encode()))


@settings(max_examples=150, deadline=None)
@given(CONTENT)
def test_any_plan_file_is_an_object_or_one_line(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "plan.json"
        path.write_bytes(content)
        data: object = None
        message = ""
        try:
            data = read_plan_file(path)
        except LauncherError as exc:
            message = str(exc)
    if message:
        assert "\n" not in message
        assert str(path) in message
    else:
        assert isinstance(data, dict)


@pytest.mark.parametrize("content", [b"\xff\xfe{}", b"[" * 100_000])
def test_a_plan_file_that_was_a_traceback_is_one_line(tmp_path: Path, content: bytes) -> None:
    # found here: UnicodeDecodeError and RecursionError went past `except JSONDecodeError`
    (tmp_path / "plan.json").write_bytes(content)
    with pytest.raises(LauncherError, match="is not"):
        read_plan_file(tmp_path / "plan.json")


@settings(max_examples=150, deadline=None)
@given(CONTENT.map(lambda b: b.decode("utf-8", "replace")), st.booleans())
def test_any_compilation_config_value_is_merged_with_ours_or_refused_in_one_line(
    value: str, joined: bool
) -> None:
    assume(not re.search(r"\d[kKmMgGtT]", value))  # vLLM's size suffixes: test_engine_command
    ours = {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    args = [f"{COMPILATION_CONFIG}={value}"] if joined else [COMPILATION_CONFIG, value]
    try:
        user = json.loads(value)
    except (ValueError, RecursionError):
        user = None
    if not isinstance(user, dict):
        with pytest.raises(EngineError) as refused:
            _merge_json_flag(args, (COMPILATION_CONFIG,), ours)
        assert "\n" not in str(refused.value)
        assert "is not a JSON object" in str(refused.value)
        return
    out, found = _merge_json_flag(args, (COMPILATION_CONFIG,), ours)
    assert found
    merged = json.loads(out[-1].split("=", 1)[1] if joined else out[-1])
    # as text: a NaN the user gave is no NaN equal to itself
    assert json.dumps(merged, sort_keys=True) == json.dumps({**user, **ours}, sort_keys=True)
