"""The inline request-body parse (server.app.parse_object) takes pydantic_core's parser first
and json.loads wherever that one refuses: what it accepts, what it refuses and what it says
about a refusal must stay exactly json.loads' (the hostile tests' texts and limits)."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.app import _TOO_DEEP, parse_object
from server.errors import BadRequest


def reference(body: bytes) -> dict[str, Any] | str:
    """What parse_object returned before the fast parser: json.loads and its error texts."""
    try:
        obj = json.loads(body)
    except UnicodeDecodeError:
        return "request body is not valid UTF-8"
    except RecursionError:
        return _TOO_DEEP
    except json.JSONDecodeError as exc:
        return f"request body is not valid JSON: {exc}"
    except ValueError:  # an integer past sys.get_int_max_str_digits()
        return (f"request body has an integer of over {sys.get_int_max_str_digits()} digits, "
                "more than the proxy reads: send shorter numbers")
    if not isinstance(obj, dict):
        return "request body must be a JSON object"
    return obj  # type: ignore[no-any-return]


def outcome(body: bytes) -> dict[str, Any] | str:
    try:
        return parse_object(body)
    except BadRequest as exc:
        return exc.message


def same(a: object, b: object) -> bool:
    """Equal, NaN included (json.loads and the fast parser both read NaN)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
           | st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=30)
objects = st.dictionaries(st.text(max_size=8), values, max_size=5)


@settings(max_examples=300, deadline=None)
@given(obj=objects, cut=st.integers(min_value=0, max_value=400),
       insert=st.sampled_from([b"", b"\x00", b"\xff", b"\\ud800", b"\x01", b"]", b"}", b",",
                               b"\xef\xbb\xbf", b'"', b"\\", b"NaN", b"1e999", b" "]),
       encoding=st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32-le"]),
       ensure_ascii=st.booleans())
def test_parse_matches_json_loads_on_generated_and_damaged_bodies(
        obj: dict[str, Any], cut: int, insert: bytes, encoding: str, ensure_ascii: bool) -> None:
    body = json.dumps(obj, ensure_ascii=ensure_ascii).encode(encoding)
    for candidate in (body, body[:cut] + insert + body[cut:], body[:cut]):
        got, want = outcome(candidate), reference(candidate)
        assert same(got, want), (candidate[:200], got, want)


@pytest.mark.parametrize("body", [
    b'{"a": "\\ud800"}',  # a lone surrogate: json.loads keeps it, the fast parser refuses
    b'\xef\xbb\xbf{"a": 1}',  # a UTF-8 BOM
    '{"a": "é"}'.encode("utf-16"),
    b'{"a": ' + b"[" * 500 + b"]" * 500 + b"}",  # past the fast parser's depth, within json's
    b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}",  # past both: the 400 that says "flatter"
    b'{"a": "x\x01"}', b"[1, 2]", b"", b'{"a": 1, "a": 2}', b'{"a": NaN, "b": -Infinity}',
    b'{"a": 123456789012345678901234567890}',
])
def test_bodies_the_two_parsers_read_differently_get_json_loads_answer(body: bytes) -> None:
    assert same(outcome(body), reference(body))
