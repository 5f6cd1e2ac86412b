"""What the simulated engine's answers look like, per route (pure): bytes rendered once per
generation, so that a token costs one lookup.

- ``/v1/chat/completions`` and ``/v1/completions``: vLLM's chunks (chat: a role-only chunk
  first, sent with token 0), ``finish_reason`` on the last, then the usage chunk (``choices``
  empty) only with ``stream_options.include_usage``, and ``data: [DONE]``. With
  ``continuous_usage_stats`` as well (vLLM honours it only together with ``include_usage``),
  every chunk carries the usage so far.
- ``/v1/messages``: vLLM's Anthropic events (``message_start``, ``content_block_start``, one
  ``content_block_delta`` per token, ``content_block_stop``, ``message_delta``,
  ``message_stop``), each an ``event:`` line and its ``data:``; no ``[DONE]``.
- ``/v1/responses``: the Responses events a client relies on (``response.created``, one
  ``response.output_text.delta`` per token, ``response.completed``); no ``[DONE]``.

JSON is compact, as vLLM writes it, or with ``spaced`` Python's default spacing (``"a": 1,
"b": []``), as an independent engine may. With a ``fingerprint``, ``system_fingerprint`` goes
where vLLM puts it: on each choice's last chunk, or on the usage chunk instead when usage is
asked for.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

TOKEN_TEXT = " tok"
DONE = b"data: [DONE]\n\n"
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion",
          "/v1/messages": "messages", "/v1/responses": "responses"}


@dataclass(frozen=True)
class Answer:
    """What one generation answers, as far as its bytes go."""

    kind: str  # a value of ROUTES
    model: str
    n_tokens: int
    prompt_tokens: int
    finish_reason: str  # "length" or "stop", in OpenAI's terms
    include_usage: bool = False
    continuous_usage: bool = False
    spaced: bool = False
    fingerprint: str | None = None


class Templates:
    """The bytes of one generation: ``first`` goes before token 0, ``token(k)`` is token k's
    event(s), ``last(k)`` the last token's with everything that ends the stream."""

    def __init__(self, answer: Answer) -> None:
        self.a = answer
        self.separators = (", ", ": ") if answer.spaced else (",", ":")
        rid = uuid.uuid4().hex
        self.created = int(time.time())
        kind = answer.kind
        self.id = {"chat": "chatcmpl-", "completion": "cmpl-", "messages": "msg_",
                   "responses": "resp_"}[kind] + rid
        self.first = b""
        if kind == "chat":
            self.first = self._chunk([self._choice(None, role=True)])
        elif kind == "messages":
            self.first = self._event("message_start", {"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": answer.model,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": answer.prompt_tokens, "output_tokens": 0}}}
            ) + self._event("content_block_start", {
                "type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}})
        elif kind == "responses":
            self.first = self._event("response.created", {
                "type": "response.created", "sequence_number": 0,
                "response": self._response("in_progress", "")})
        # Rendered once, unless it changes with k (usage so far; Responses' sequence numbers).
        per_k = answer.continuous_usage or kind == "responses"
        self._token = b"" if per_k else self._token_event(0)

    # -- streamed ------------------------------------------------------------------------------

    def token(self, k: int) -> bytes:
        return self._token or self._token_event(k)

    def last(self, k: int) -> bytes:
        a = self.a
        kind = a.kind
        if kind == "messages":
            stop = "max_tokens" if a.finish_reason == "length" else "end_turn"
            return (self._token_event(k)
                    + self._event("content_block_stop", {"type": "content_block_stop",
                                                         "index": 0})
                    + self._event("message_delta", {
                        "type": "message_delta",
                        "delta": {"stop_reason": stop, "stop_sequence": None},
                        "usage": {"output_tokens": a.n_tokens}})
                    + self._event("message_stop", {"type": "message_stop"}))
        if kind == "responses":
            status = "completed" if a.finish_reason == "stop" else "incomplete"
            return self._token_event(k) + self._event("response.completed", {
                "type": "response.completed", "sequence_number": k + 2,
                "response": self._response(status, TOKEN_TEXT * a.n_tokens)})
        stamp = a.fingerprint is not None and not a.include_usage
        data = self._chunk([self._choice(a.finish_reason)], k + 1, fingerprint=stamp)
        if a.include_usage:
            data += self._chunk([], a.n_tokens, usage=True, fingerprint=a.fingerprint is not None)
        return data + DONE

    def _token_event(self, k: int) -> bytes:
        kind = self.a.kind
        if kind == "messages":
            return self._event("content_block_delta", {
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": TOKEN_TEXT}})
        if kind == "responses":
            return self._event("response.output_text.delta", {
                "type": "response.output_text.delta", "sequence_number": k + 1,
                "item_id": "msg_" + self.id, "output_index": 0, "content_index": 0,
                "delta": TOKEN_TEXT})
        return self._chunk([self._choice(None)], k + 1)

    def _chunk(self, choices: list[dict[str, Any]], completed: int = 0, usage: bool = False,
               fingerprint: bool = False) -> bytes:
        a = self.a
        obj: dict[str, Any] = {
            "id": self.id, "object": "chat.completion.chunk" if a.kind == "chat" else
            "text_completion", "created": self.created, "model": a.model, "choices": choices}
        if usage or (a.continuous_usage and choices):
            obj["usage"] = self._usage(completed)
        if fingerprint:
            obj["system_fingerprint"] = a.fingerprint
        return b"data: " + self._dumps(obj).encode() + b"\n\n"

    def _choice(self, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.a.kind == "chat":
            delta = {"role": "assistant", "content": ""} if role else {"content": TOKEN_TEXT}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": TOKEN_TEXT, "logprobs": None, "finish_reason": finish,
                "stop_reason": None}

    def _usage(self, completed: int) -> dict[str, int]:
        p = self.a.prompt_tokens
        return {"prompt_tokens": p, "total_tokens": p + completed, "completion_tokens": completed}

    def _dumps(self, obj: Any) -> str:
        return json.dumps(obj, separators=self.separators)

    def _event(self, name: str, obj: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {self._dumps(obj)}\n\n".encode()

    def _response(self, status: str, text: str) -> dict[str, Any]:
        a = self.a
        output = [{"type": "message", "id": "msg_" + self.id, "status": status,
                   "role": "assistant", "content": [
                       {"type": "output_text", "text": text, "annotations": []}]}] if text else []
        return {"id": self.id, "object": "response", "created_at": self.created,
                "model": a.model, "status": status, "output": output,
                "usage": {"input_tokens": a.prompt_tokens,
                          "output_tokens": a.n_tokens if text else 0,
                          "total_tokens": a.prompt_tokens + (a.n_tokens if text else 0)}}

    # -- not streamed --------------------------------------------------------------------------

    def full(self) -> bytes:
        a = self.a
        text = TOKEN_TEXT * a.n_tokens
        usage = self._usage(a.n_tokens)
        obj: dict[str, Any]
        if a.kind == "messages":
            obj = {"id": self.id, "type": "message", "role": "assistant", "model": a.model,
                   "content": [{"type": "text", "text": text}],
                   "stop_reason": "max_tokens" if a.finish_reason == "length" else "end_turn",
                   "stop_sequence": None,
                   "usage": {"input_tokens": a.prompt_tokens, "output_tokens": a.n_tokens}}
        elif a.kind == "responses":
            obj = self._response("completed" if a.finish_reason == "stop" else "incomplete",
                                 text)
        else:
            if a.kind == "chat":
                choice: dict[str, Any] = {"index": 0, "message": {
                    "role": "assistant", "content": text, "tool_calls": []}}
            else:
                choice = {"index": 0, "text": text}
            choice.update({"logprobs": None, "finish_reason": a.finish_reason,
                           "stop_reason": None})
            obj = {"id": self.id, "object": "chat.completion" if a.kind == "chat" else
                   "text_completion", "created": self.created, "model": a.model,
                   "choices": [choice], "usage": usage}
            if a.fingerprint is not None:
                obj["system_fingerprint"] = a.fingerprint
        return self._dumps(obj).encode()
