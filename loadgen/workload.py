"""Request bodies of exact length, prepared from what the target told us.

Completions: token ids (exact by construction). Chat: words fitted once through /tokenize to the
exact templated length, then shuffled per request; tokenizers split on spaces first, so a
shuffle keeps the count, and the server's `usage` verifies it on every request anyway.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadgen.config import Config
from loadgen.prompts import fit_text, prompt_ids, seeded_text, token_pool
from loadgen.target import (
    Target,
    TargetClient,
    check_context,
    max_model_len,
    pick_model,
    plan_label,
)
from loadgen.timing import Expected
from loadgen.transport import Endpoint, request_bytes

_POOL_WORDS = 3000  # seeded text tokenized once to learn valid token ids
_VERIFY_CHAT = 4  # shuffled chat prompts checked with /tokenize before the run


@dataclass(frozen=True)
class Prompts:
    """Everything needed to build request `i`'s prompt without talking to the server."""

    pool: tuple[int, ...] = ()  # completions: valid token ids
    shared_words: tuple[str, ...] = ()  # chat: the prefix every request shares
    own_words: tuple[str, ...] = ()  # chat: the rest, shuffled per request


@dataclass(frozen=True)
class Workload:
    target: Target
    prompts: Prompts
    config: Config

    @property
    def expected(self) -> Expected:
        return Expected(self.config.prompt, self.config.gen)

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.config.chat else "/v1/completions"

    def body(self, index: int, gen: int | None = None, prompt: int | None = None) -> dict[str, Any]:
        cfg = self.config
        tokens = cfg.gen if gen is None else gen
        body: dict[str, Any] = {
            "model": self.target.model,
            "max_tokens": tokens,
            "min_tokens": tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if cfg.chat:
            body["messages"] = [{"role": "user", "content": self.chat_text(index)}]
        else:
            length = cfg.prompt if prompt is None else prompt
            shared = min(cfg.shared_prefix, length - 1) if cfg.shared_prefix else 0
            body["prompt"] = prompt_ids(self.prompts.pool, length, str(cfg.seed), index, shared)
        return body

    def chat_text(self, index: int) -> str:
        # The first word has no space before it and may tokenize differently: it stays put.
        words = [*self.prompts.shared_words, *self.prompts.own_words]
        head, rest = words[:1], words[1 + len(self.prompts.shared_words[1:]) :]
        random.Random(f"{self.config.seed}:{index}").shuffle(rest)
        return " ".join([*head, *self.prompts.shared_words[1:], *rest])

    def payload_fn(
        self, gen: int | None = None, prompt: int | None = None
    ) -> Callable[[int], bytes]:
        endpoint = Endpoint.parse(self.config.url)

        def payload(index: int) -> bytes:
            body = json.dumps(self.body(index, gen, prompt), separators=(",", ":")).encode()
            return request_bytes(endpoint, self.path, body, self.config.api_key)

        return payload


def prepare(config: Config) -> Workload:
    """Ask the target what it serves and build the prompt material; TargetError if it cannot."""
    client = TargetClient(config.url, config.api_key)
    try:
        model = pick_model(client.models(), config.model, config.url)
        name = str(model.get("id"))
        sample = client.tokenize(
            name, prompt=seeded_text(f"{config.seed}:pool", _POOL_WORDS), add_special_tokens=False
        )
        target = Target(
            config.url, name, max_model_len(model, sample), plan_label(client.metrics_text())
        )
        check_context(target.max_model_len, config.prompt, config.gen, name)
        if config.chat:
            prompts = _chat_prompts(client, name, config)
        else:
            prompts = Prompts(pool=token_pool([int(t) for t in sample["tokens"]]))
        workload = Workload(target, prompts, config)
        if config.chat:
            _verify_chat(client, workload)
        return workload
    finally:
        client.close()


def _chat_counter(client: TargetClient, model: str) -> Callable[[str], int]:
    def count(text: str) -> int:
        body = client.tokenize(
            model, messages=[{"role": "user", "content": text}], add_generation_prompt=True
        )
        return int(body.get("count", len(body["tokens"])))

    return count


def _chat_prompts(client: TargetClient, model: str, config: Config) -> Prompts:
    count = _chat_counter(client, model)
    seed = str(config.seed)
    shared = fit_text(count, config.shared_prefix, seed + ":shared") if config.shared_prefix else ""
    full = fit_text(count, config.prompt, seed + ":own", prefix=shared)
    shared_words = tuple(shared.split())
    return Prompts(shared_words=shared_words, own_words=tuple(full.split()[len(shared_words) :]))


def _verify_chat(client: TargetClient, workload: Workload) -> None:
    from loadgen.errors import PromptError

    count = _chat_counter(client, workload.target.model)
    for index in range(_VERIFY_CHAT):
        got = count(workload.chat_text(index))
        if got != workload.config.prompt:
            raise PromptError(
                f"a shuffled chat prompt counts {got} tokens, not {workload.config.prompt}: this"
                " tokenizer merges across spaces; use completions mode (drop --chat)"
            )
