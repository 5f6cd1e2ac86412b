"""What a server answers loadgen, fed generated variants: /v1/models, /tokenize and control-plane
bodies of any shape (through httpx's MockTransport), stream events and error bodies of any bytes,
JSON nested past Python's recursion limit included. Each is read, or is one LoadgenError line
(NoTokenize: loadgen counts by the server's usage instead); never a traceback."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.errors import LoadgenError, NoTokenize
from loadgen.prompts import token_pool
from loadgen.sse import classify
from loadgen.target import TargetClient, max_model_len, pick_model, plan_label
from loadgen.timing import _body_error
from loadgen.tokens import RemoteCounter

DEEP = st.sampled_from([b"[" * 100_000, b'{"a":' * 100_000, b'{"error":' * 100_000])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)
MODEL = st.fixed_dictionaries({}, optional={"id": JSON, "max_model_len": JSON})
BODIES = st.one_of(
    st.binary(max_size=40), DEEP, JSON.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["data", "tokens", "count", "max_model_len"]),
                    st.one_of(JSON, st.lists(st.one_of(MODEL, JSON), max_size=3)),
                    max_size=3).map(lambda v: json.dumps(v).encode()),
)
STATUS = st.sampled_from([200, 200, 200, 400, 401, 404, 500])


def client(status: int, body: bytes) -> TargetClient:
    c = TargetClient("http://target.invalid", None)
    c._http = httpx.Client(base_url=c.url, transport=httpx.MockTransport(
        lambda request: httpx.Response(status, content=body)))
    return c


def one_line(exc: BaseException) -> None:
    assert str(exc).strip()
    assert "\n" not in str(exc)


@settings(max_examples=200, deadline=None)
@given(STATUS, BODIES)
def test_any_models_answer_is_a_model_or_one_line(status: int, body: bytes) -> None:
    try:
        models = client(status, body).models()
        model = pick_model(models, None, "http://target.invalid")
    except LoadgenError as exc:
        one_line(exc)
        return
    assert isinstance(model["id"], str)
    assert model["id"]
    limit = max_model_len(model, None)
    assert limit is None or (type(limit) is int and limit > 0)


@settings(max_examples=200, deadline=None)
@given(STATUS, BODIES)
def test_any_tokenize_answer_is_a_token_list_or_no_tokenize(status: int, body: bytes) -> None:
    c = client(status, body)
    try:
        answer = c.tokenize("m", prompt="hello")
    except LoadgenError as exc:
        one_line(exc)
        return
    tokens = answer["tokens"]
    assert all(type(t) is int and t >= 0 for t in tokens)
    assert RemoteCounter(c.tokenize, "m").text("hello") >= 0
    try:
        token_pool(tokens)
    except LoadgenError as exc:
        one_line(exc)


@pytest.mark.parametrize("body", [b'{"data": [1, "m"]}', b'{"data": [[]]}', b'{"data": [{}]}',
                                  b'{"data": [{"id": 7}]}'])
def test_a_model_list_of_no_model_objects_is_one_line(body: bytes) -> None:
    # found here: the list filtered to nothing, then models[0] was an IndexError; an entry
    # without a string id was served as the model "None" (or "7")
    with pytest.raises(LoadgenError, match="lists no model"):
        client(200, body).models()


@pytest.mark.parametrize("tokens", [[["a"], ["b"]], ["x", "y"], [True, 3], [-1, 2]])
def test_a_token_list_of_other_things_counts_by_usage(tokens: list[Any]) -> None:
    # found here: unhashable ids were a TypeError (set()), strings a ValueError (int())
    with pytest.raises(NoTokenize):
        client(200, json.dumps({"tokens": tokens}).encode()).tokenize("m", prompt="x")


def test_a_context_length_of_true_is_no_context_length() -> None:
    assert max_model_len({"max_model_len": True}, None) is None


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=60), DEEP, JSON.map(lambda v: json.dumps(v).encode())))
def test_any_stream_event_or_error_body_is_read(payload: bytes) -> None:
    chunk = classify(payload)
    assert isinstance(chunk.text, str)
    assert chunk.error is None or isinstance(chunk.error, str)
    assert isinstance(_body_error(((0.0, payload[:50_000]), (0.1, payload[50_000:]))), str)


def test_a_stream_event_nested_past_the_recursion_limit_is_a_malformed_event() -> None:
    # found here: json's RecursionError went past `except ValueError` as a traceback
    assert (classify(b"[" * 100_000).error or "").startswith("malformed stream event")


PLAN_LINES = st.sampled_from([
    '# TYPE toposerve_plan_info gauge', 'toposerve_plan_info{tp="2",pp="1",mode="x"} 1',
    'toposerve_plan_info{} 1', 'toposerve_plan_info{tp="2"} 0', 'toposerve_plan_info 1',
    'toposerve_plan_info{tp="2" 1', 'other_metric 3', '# HELP toposerve_plan_info x',
])  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(PLAN_LINES, st.text(max_size=30)), max_size=6).map("\n".join))
def test_any_metrics_text_gives_a_plan_label_or_unknown(text: str) -> None:
    label = plan_label(text)
    keys = ("mode=", "tp=", "pp=", "dp=", "transport=", "engine=")
    assert label == "unknown" or label.startswith(keys)
