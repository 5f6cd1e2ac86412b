"""Request shapes the proxy checks before forwarding (and documents in its OpenAPI schema).

Only the fields the proxy relies on are typed; everything else passes to vLLM untouched
(``extra="allow"``), which validates the rest and answers 400 itself.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, TypeAdapter


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Open):
    include_usage: StrictBool | None = None


class ChatMessage(_Open):
    role: str
    content: str | list[dict[str, Any]] | None = None


class _Generation(_Open):
    model: str | None = Field(None, description="served model name (see /v1/models)")
    # Strict: "yes" must not silently become a stream (the proxy acts on this one itself).
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    # Strict: "5" and true are not token counts (vLLM would take both).
    max_tokens: StrictInt | None = Field(None, ge=0)


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=0)


class CompletionRequest(_Generation):
    # Token ids first: pydantic tries the members in order, and a list of ids tried as
    # list[str] first makes (and drops) one error per id: ~370 µs of a 512-id request's
    # CPU on the event loop, measured (issue 25). A string fails list[int] at once. What is
    # accepted does not depend on the order (tests/server/test_prompt_schema.py).
    prompt: list[int] | list[list[int]] | str | list[str]


# What a large chat request's messages are validated with, a slice at a time (server.app).
message_list: TypeAdapter[list[ChatMessage]] = TypeAdapter(list[ChatMessage])
