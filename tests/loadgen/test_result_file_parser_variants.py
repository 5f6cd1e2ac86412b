"""`loadgen compare A.json B.json`, fed generated files: any bytes, JSON nested past Python's
recursion limit, results whose runs lack their config or summary. Each compares or is one
BadArgument line; never a traceback (a run without a config was a KeyError)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.errors import BadArgument
from loadgen.outputs.compare import comparison, load

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=10,
)
RUN = st.fixed_dictionaries({}, optional={
    "config": st.one_of(JSON, st.fixed_dictionaries({}, optional={"concurrency": JSON})),
    "summary": st.one_of(JSON, st.dictionaries(st.sampled_from(["ttft_s", "output_tok_s"]),
                                               JSON, max_size=2)),
})
RESULT = st.one_of(RUN, st.fixed_dictionaries({"runs": st.one_of(JSON, st.lists(RUN, max_size=3))}))
FILES = st.one_of(st.binary(max_size=40), st.just(b"[" * 100_000),
                  st.one_of(JSON, RESULT).map(lambda v: json.dumps(v).encode()))


def _loaded(content: bytes) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "result.json"
        path.write_bytes(content)
        return load(path)


@settings(max_examples=300, deadline=None)
@given(FILES, FILES)
def test_any_two_files_compare_or_are_one_line(a: bytes, b: bytes) -> None:
    rows: list[Any] = []
    message = ""
    try:
        rows = comparison(_loaded(a), _loaded(b))
    except BadArgument as exc:
        message = str(exc)
    assert ("\n" not in message) if message else rows


@pytest.mark.parametrize("content", [b'{"summary": {}}', b'{"runs": [{"summary": {}}]}',
                                     b'{"runs": 3}', b"[" * 100_000])
def test_a_result_that_was_a_traceback_is_one_line(content: bytes) -> None:
    with pytest.raises(BadArgument):
        comparison(_loaded(content), _loaded(content))
