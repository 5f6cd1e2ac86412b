"""benchmarks/gpu/jsonl_rows.py, the JSONL loop burst_stamps.py and host_speed_read.py share:
every non-blank line is a row or counted, whatever it holds (a line cut mid-write, bytes that
were not UTF-8, JSON nested past the parser's depth), and the two readers keep what they kept."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.scripts import load_script

JR = load_script("benchmarks/gpu/jsonl_rows.py", "jsonl_rows_benchmark")
BS = load_script("benchmarks/gpu/burst_stamps.py", "burst_stamps_benchmark")
RD = load_script("benchmarks/gpu/host_speed_read.py", "host_speed_read_benchmark")

DEEP = ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000, "[" * 5000]
LINES = st.lists(st.one_of(
    st.text(max_size=30), st.sampled_from(["", "  ", "\t"]), st.sampled_from(DEEP),
    st.integers().map(str), st.lists(st.integers(), max_size=3).map(json.dumps),
), max_size=20)


def _ints(value: object) -> list[int] | None:
    return value if isinstance(value, list) and all(type(x) is int for x in value) else None


@settings(max_examples=200, deadline=None)
@given(LINES)
def test_every_non_blank_line_is_a_row_or_counted_never_an_exception(lines: list[str]) -> None:
    rows, bad = JR.read_rows(lines, _ints)
    assert len(rows) + bad == sum(1 for line in lines if line.strip())
    assert all(_ints(r) == r for r in rows)


def test_json_nested_past_the_parsers_depth_is_counted_by_both_readers() -> None:
    # was a RecursionError traceback through both readers' `except ValueError`
    assert BS.parse_lines([*DEEP, '[1.5, "app", 3]'], pid=7)[1] == len(DEEP)
    rows, bad = RD.parse("\n".join([*DEEP, '{"ref_cpu_ms": 2.5}']))
    assert (rows, bad) == ([{"ref_cpu_ms": 2.5}], len(DEEP))


def test_a_cut_line_and_a_json_value_that_is_no_row_are_counted_and_blank_lines_are_not() -> None:
    events, bad = BS.parse_lines(['[1.5, "app", 3]', "", '[2.0, "sch', "[true, \"app\"]",
                                  '["x"]', '[NaN, "app"]'], pid=7)
    assert [(e.t, e.name, e.args, e.pid) for e in events] == [(1.5, "app", (3,), 7)]
    assert bad == 4
    rows, bad = RD.parse('{"ref_cpu_ms": 1}\n\n{"ref_cpu_ms": 0}\n{"ref_cpu_ms": 1\n[]\n')
    assert (rows, bad) == ([{"ref_cpu_ms": 1}], 3)
