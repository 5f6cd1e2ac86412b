"""The completions prompt's schema takes token ids first (fast for the usual large prompt); what
it accepts is what the union in any other order accepts (generated prompts)."""

from __future__ import annotations

from typing import Any, Union

from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from server.schemas import CompletionRequest

OLD_ORDER: TypeAdapter[Any] = TypeAdapter(Union[str, list[str], list[int], list[list[int]]])  # noqa: UP007
leaf = st.one_of(st.integers(-3, 3), st.text(max_size=3), st.booleans(), st.floats(0, 2),
                 st.none())
prompts = st.one_of(leaf, st.lists(leaf, max_size=4), st.lists(st.lists(leaf, max_size=3),
                                                                 max_size=3))


def accepted(validate: Any, prompt: Any) -> bool:
    try:
        validate(prompt)
    except ValidationError:
        return False
    return True


@given(prompt=prompts)
def test_the_prompt_schema_accepts_what_any_member_order_accepts(prompt: Any) -> None:
    new = accepted(lambda p: CompletionRequest.model_validate({"prompt": p}), prompt)
    assert new == accepted(OLD_ORDER.validate_python, prompt)
