"""topocommon.jsontext.loads, fed generated variants: nesting below, at and past the depth the
parser reaches, bytes that are not UTF-8, numbers past a float and past Python's integer digit
guard, NaN and Infinity. Each is json.loads' own value or a ValueError; never a RecursionError."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topocommon.jsontext import NestedTooDeep, loads

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=10,
)
OPEN = {"[": "]", '{"k":': "}"}


def nested(openers: list[str], closed: bool = True) -> str:
    """JSON of ``0`` inside the containers ``openers`` names, outermost first."""
    inner = "0" + ("".join(OPEN[o] for o in reversed(openers)) if closed else "")
    return "".join(openers) + inner


def depth_of(value: Any) -> int:
    """How many containers deep the ``0`` of nested() sits, walked without recursion (the value
    may be as deep as the parser goes, too deep for == or repr)."""
    n = 0
    while isinstance(value, (list, dict)):
        value = value[0] if isinstance(value, list) else value["k"]
        n += 1
    assert value == 0
    return n


@settings(max_examples=120, deadline=None)
@given(st.lists(st.sampled_from(list(OPEN)), min_size=1, max_size=3000)
       | st.integers(50_000, 200_000).flatmap(
           lambda n: st.sampled_from([["["] * n, ['{"k":'] * n]))
       , st.booleans())
def test_nesting_at_any_depth_is_its_value_or_nested_too_deep(openers: list[str],
                                                              closed: bool) -> None:
    text = nested(openers, closed)
    try:
        value = loads(text)
    except NestedTooDeep:
        assert len(openers) > 100  # shallow JSON is read wherever it is called from
    except json.JSONDecodeError:
        assert not closed  # only the unclosed text is not JSON
    else:
        assert closed
        assert depth_of(value) == len(openers)
    if len(openers) >= 50_000:  # past any interpreter's limit, 3.11's 1000 and 3.12's C stack
        with pytest.raises(NestedTooDeep):
            loads(text)
    assert loads("[[1]]") == [[1]]  # the refusal left the parser and the stack whole


@pytest.mark.parametrize("opener", list(OPEN))
@pytest.mark.parametrize("as_bytes", [False, True])
def test_the_deepest_nesting_read_is_read_and_one_more_is_nested_too_deep(
        opener: str, as_bytes: bool) -> None:
    # searched from this frame: the depth the parser reaches varies with the stack above it
    def text(depth: int) -> str | bytes:
        t = nested([opener] * depth)
        return t.encode() if as_bytes else t

    low, high = 1, 1 << 18
    while low < high:
        mid = (low + high + 1) // 2
        try:
            loads(text(mid))
            low = mid
        except NestedTooDeep:
            high = mid - 1
    assert low > 100
    assert depth_of(loads(text(low))) == low
    with pytest.raises(NestedTooDeep):
        loads(text(low + 1))


def test_nesting_read_from_a_deep_call_stack_is_its_value_or_nested_too_deep() -> None:
    # 3.11 counts the caller's frames against the parser's depth: JSON read at the top of the
    # stack can be too deep for a caller deep in it, and must then be a ValueError there too.
    text = nested(["["] * 200)

    def down(frames: int) -> object:
        if frames:
            return down(frames - 1)
        try:
            return depth_of(loads(text))
        except NestedTooDeep:
            return "too deep"

    assert down(sys.getrecursionlimit() - 150) in (200, "too deep")


def test_too_deep_names_no_position_a_user_would_look_for() -> None:
    # JSONDecodeError's lineno/colno would be made up here; callers print them when present
    with pytest.raises(NestedTooDeep) as caught:
        loads("[" * 100_000)
    assert isinstance(caught.value, ValueError)  # what every caller's except catches
    assert not isinstance(caught.value, json.JSONDecodeError)
    assert str(caught.value)
    assert "\n" not in str(caught.value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60) | st.text(max_size=60))
def test_any_input_is_jsons_value_or_a_value_error(text: bytes | str) -> None:
    try:
        expected: object = json.loads(text)
    except ValueError as exc:
        with pytest.raises(type(exc)):  # JSONDecodeError or UnicodeDecodeError, as json says
            loads(text)
        return
    got = loads(text)
    assert json.dumps(got) == json.dumps(expected)  # NaN != NaN; its JSON text is equal


@settings(max_examples=150, deadline=None)
@given(JSON, st.sampled_from(["utf-8", "utf-16", "utf-16-le", "utf-32", "utf-32-be"]))
def test_json_text_and_its_bytes_in_any_json_encoding_read_back_as_written(
        value: Any, encoding: str) -> None:
    text = json.dumps(value, ensure_ascii=False)
    assert loads(text) == value
    assert loads(text.encode(encoding)) == value


@settings(max_examples=150, deadline=None)
@given(JSON, st.data())
def test_a_byte_that_is_never_utf8_is_a_unicode_decode_error(value: Any,
                                                             data: st.DataObject) -> None:
    raw = json.dumps(value).encode()  # ASCII: json detects UTF-8 for it whatever is inserted
    at = data.draw(st.integers(0, len(raw)))
    bad = data.draw(st.sampled_from([0xC0, 0xC1, *range(0xF5, 0x100)]))
    with pytest.raises(UnicodeDecodeError):
        loads(raw[:at] + bytes([bad]) + raw[at:])


@settings(max_examples=100, deadline=None)
@given(st.integers(-(10 ** 4000), 10 ** 4000))
def test_integers_within_pythons_digit_guard_are_read_exactly(n: int) -> None:
    assert loads(str(n)) == n
    assert loads(f"[{n}]".encode()) == [n]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 2000), st.sampled_from(["1", "9", "-9"]))
def test_integers_past_pythons_digit_guard_are_a_value_error(extra: int, lead: str) -> None:
    guard = sys.get_int_max_str_digits()
    with pytest.raises(ValueError, match="digits"):
        loads(lead + "0" * (guard + extra - 1))


@settings(max_examples=100, deadline=None)
@given(st.floats(allow_nan=False))
def test_any_double_reads_back_as_written(x: float) -> None:
    assert loads(json.dumps(x)) == x  # json writes inf as Infinity and reads it back


@settings(max_examples=100, deadline=None)
@given(st.integers(309, 100_000), st.sampled_from([("", math.inf), ("-", -math.inf)]))
def test_numbers_past_a_double_read_as_infinity_as_json_reads_them(
        exponent: int, sign: tuple[str, float]) -> None:
    assert loads(f"{sign[0]}1e{exponent}") == sign[1]
    assert loads(f"{sign[0]}1.5E+{exponent}".encode()) == sign[1]


@pytest.mark.parametrize(("text", "check"), [
    ("NaN", math.isnan),
    ("Infinity", lambda x: x == math.inf),
    ("-Infinity", lambda x: x == -math.inf),
    ("-1e400", lambda x: x == -math.inf),
])
def test_nan_and_infinity_are_read_as_floats_as_json_reads_them(text: str, check: Any) -> None:
    # kept from json.loads: every caller read them before this seam existed (NaN in a kept
    # record then fails that record's own field check, with its own reason)
    assert check(loads(text))
    assert check(loads(f'{{"x": [{text}]}}'.encode())["x"][0])  # type: ignore[index]
