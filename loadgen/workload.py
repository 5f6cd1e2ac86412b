"""Request bodies of exact length, prepared from what the target told us.

Where token counts come from (loadgen/tokens.py), in order: `--tokenizer` (a local Hugging Face
tokenizer), the target's `/tokenize` (vLLM, the proxy), or, with neither, the server's own usage
(calibration). Prompt formats:

* `ids` (completions against a target with /tokenize): token ids drawn from ids its /tokenize
  gave, so every id is in the served vocabulary; exact by construction.
* `text` (completions otherwise): words fitted once to the exact count, shuffled per request.
* `chat`: words fitted once to the exact templated count, shuffled per request.

Tokenizers split on spaces first, so a shuffle keeps the count (the first word, which has no
space before it, stays first); four shuffles are re-counted before the run, and the server's
`usage` verifies every request anyway. Token ids go only to a server whose /tokenize vouches for
them: another server may not accept ids, or may have another vocabulary.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loadgen.config import Config
from loadgen.errors import NoTokenize, PromptError, TargetError
from loadgen.prompts import fit_text, prompt_ids, seeded_text, token_pool
from loadgen.target import (
    Target,
    TargetClient,
    check_context,
    max_model_len,
    pick_model,
    plan_label,
)
from loadgen.timing import Expected, OutputCounter
from loadgen.tokens import Counter, LocalCounter, RemoteCounter, UsageCounter, load_tokenizer
from loadgen.transport import Endpoint, request_bytes

_POOL_WORDS = 3000  # seeded text tokenized once to learn valid token ids
_VERIFY = 4  # shuffled prompts re-counted before the run


@dataclass(frozen=True)
class PromptInfo:
    """How prompts were made, and how exact the check before the run found them (JSON)."""

    source: str  # "tokenize", "tokenizer" or "usage"
    format: str  # "ids", "text" or "chat"
    checked: int = 0  # shuffled prompts re-counted before the run
    exact: int = 0  # of those, how many had exactly the length asked
    max_off: int = 0  # the largest difference among them, in tokens
    calibration_requests: int = 0  # 1-token requests spent counting (source "usage")
    tokenizer: str | None = None

    def line(self) -> str:
        how = {
            "tokenize": "counted by the target's /tokenize",
            "tokenizer": f"counted by the tokenizer {self.tokenizer}",
            "usage": f"calibrated from the server's usage ({self.calibration_requests} requests)",
        }[self.source]
        check = f"; {self.exact} of {self.checked} shuffles exact" if self.checked else ""
        off = f" (at most {self.max_off} tokens off)" if self.max_off else ""
        return f"prompts: {self.format}, {how}{check}{off}"


@dataclass(frozen=True)
class Prompts:
    """Everything needed to build request `i`'s prompt without talking to the server."""

    pool: tuple[int, ...] = ()  # ids: valid token ids
    shared_words: tuple[str, ...] = ()  # text/chat: the prefix every request shares
    own_words: tuple[str, ...] = ()  # text/chat: the rest, shuffled per request
    info: PromptInfo = PromptInfo("tokenize", "ids")


@dataclass(frozen=True)
class Workload:
    target: Target
    prompts: Prompts
    config: Config
    # Counts generated text when the server sends no usage (a local tokenizer only). Not sent
    # to --processes workers: measuring happens in the parent.
    output: OutputCounter | None = field(default=None, compare=False)

    @property
    def expected(self) -> Expected:
        strict = strict_prompt(self.prompts.info.source, self.config.strict_counts)
        return Expected(self.config.prompt, self.config.gen, strict_prompt=strict,
                        strict_completion=self.target.exact_length)

    def expected_for(self, index: int) -> Expected:
        return self.expected

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.config.chat else "/v1/completions"

    def body(self, index: int, gen: int | None = None, prompt: int | None = None) -> dict[str, Any]:
        cfg = self.config
        tokens = cfg.gen if gen is None else gen
        body = generation_body(self.target.model, tokens, self.target.exact_length)
        if cfg.chat:
            body["messages"] = [{"role": "user", "content": self.shuffled(index)}]
        elif self.prompts.info.format == "text":
            body["prompt"] = self.shuffled(index)
        else:
            length = cfg.prompt if prompt is None else prompt
            shared = min(cfg.shared_prefix, length - 1) if cfg.shared_prefix else 0
            body["prompt"] = prompt_ids(self.prompts.pool, length, str(cfg.seed), index, shared)
        return body

    def shuffled(self, index: int) -> str:
        return shuffle_words(
            self.prompts.shared_words, self.prompts.own_words, self.config.seed, index
        )

    def payload_fn(
        self, gen: int | None = None, prompt: int | None = None
    ) -> Callable[[int], bytes]:
        endpoint = Endpoint.parse(self.config.url)

        def payload(index: int) -> bytes:
            body = json.dumps(self.body(index, gen, prompt), separators=(",", ":")).encode()
            return request_bytes(endpoint, self.path, body, self.config.api_key)

        return payload


def strict_prompt(source: str, strict_counts: bool) -> bool:
    """Whether a prompt the server counted differently fails its request. Counted by the
    target's own /tokenize, yes: it is the server's count. By --tokenizer, only with
    --strict-counts: a BOS token, a template or another tokenizer moves the count while the
    timings stay good, so the difference is reported and the figures kept. Calibrated from
    usage, never: nothing better was at hand."""
    return source == "tokenize" or (source == "tokenizer" and strict_counts)


# vLLM's (and SGLang's, llama.cpp's) fields that make the output exactly max_tokens long; a
# server that refuses them (OpenAI's API: 400 "Unrecognized request argument") gets none.
EXACT_LENGTH_FIELDS = ("min_tokens", "ignore_eos")


def generation_body(model: str, tokens: int, exact_length: bool = True) -> dict[str, Any]:
    """The fields every generation request carries: exact output length, streamed, usage."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if not exact_length:
        for name in EXACT_LENGTH_FIELDS:
            del body[name]
    return body


def takes_exact_length(client: TargetClient, model: str, chat: bool) -> bool:
    """Whether the server accepts the exact-length fields: one 1-token request with them.
    False only when it answers 400/422 naming one of them; any other failure is left to the
    run, which reports it per request."""
    body = generation_body(model, 1)
    body.update(stream=False)
    del body["stream_options"]
    if chat:
        body["messages"] = [{"role": "user", "content": "Hi"}]
    else:
        body["prompt"] = "Hi"
    try:
        client.post("/v1/chat/completions" if chat else "/v1/completions", body)
    except TargetError as exc:
        text = str(exc)
        if any(f"HTTP {code}" in text for code in (400, 422)) and any(
                name in text for name in EXACT_LENGTH_FIELDS):
            return False
    return True


def shuffle_words(
    shared: tuple[str, ...], own: tuple[str, ...], seed: object, index: object
) -> str:
    # The first word has no space before it and may tokenize differently: it stays put.
    words = [*shared, *own]
    head, rest = words[:1], words[1 + len(shared[1:]) :]
    random.Random(f"{seed}:{index}").shuffle(rest)
    return " ".join([*head, *shared[1:], *rest])


@dataclass
class Source:
    """What prepare() learned: the model, its limits and a way to count its tokens."""

    client: TargetClient
    model: dict[str, Any]
    name: str
    counter: Counter
    sample: dict[str, Any] | None  # /tokenize of seeded text, when the target has it
    output: OutputCounter | None
    exact_length: bool = True  # the server takes min_tokens/ignore_eos (takes_exact_length)


def open_source(config: Config, client: TargetClient) -> Source:
    """Pick the model and the best token counter: --tokenizer, /tokenize, else usage."""
    model = pick_model(client.models(), config.model, config.url)
    name = str(model.get("id"))
    exact = takes_exact_length(client, name, config.chat or config.workload == "agent")
    sample: dict[str, Any] | None = None
    if config.tokenizer:
        local: LocalCounter = load_tokenizer(config.tokenizer)
        return Source(client, model, name, local, None, local.output, exact)
    try:
        sample = client.tokenize(
            name, prompt=seeded_text(f"{config.seed}:pool", _POOL_WORDS), add_special_tokens=False
        )
        if len(set(sample["tokens"])) < 2:
            raise NoTokenize("its /tokenize gave no tokens for sample text")
        counter: Counter = RemoteCounter(client.tokenize, name)
    except NoTokenize:
        sample, counter = None, UsageCounter(client.post, name)
    return Source(client, model, name, counter, sample, None, exact)


def prepare(config: Config) -> Workload:
    """Ask the target what it serves and build the prompt material; TargetError if it cannot."""
    client = TargetClient(config.url, config.api_key)
    try:
        src = open_source(config, client)
        target = Target(
            config.url,
            src.name,
            max_model_len(src.model, src.sample),
            plan_label(client.metrics_text()),
            exact_length=src.exact_length,
        )
        check_context(target.max_model_len, config.prompt, config.gen, src.name)
        if config.chat or src.sample is None:
            prompts = _fitted_prompts(src.counter, config)
        else:
            pool = token_pool([int(t) for t in src.sample["tokens"]])
            prompts = Prompts(pool=pool, info=PromptInfo("tokenize", "ids"))
        return Workload(target, prompts, config, src.output)
    finally:
        client.close()


def _fitted_prompts(counter: Counter, config: Config) -> Prompts:
    count = _count_fn(counter, config.chat)
    seed = str(config.seed)
    shared = fit_text(count, config.shared_prefix, seed + ":shared") if config.shared_prefix else ""
    full = fit_text(count, config.prompt, seed + ":own", prefix=shared)
    shared_words = tuple(shared.split())
    own = tuple(full.split()[len(shared_words) :])
    got = [count(shuffle_words(shared_words, own, config.seed, i)) for i in range(_VERIFY)]
    off = max(abs(g - config.prompt) for g in got)
    if off and counter.exact:
        raise PromptError(
            f"a shuffled prompt counts {max(got, key=lambda g: abs(g - config.prompt))} tokens,"
            f" not {config.prompt}: this tokenizer merges across spaces; use completions mode"
            " against vLLM (drop --chat and --tokenizer)"
        )
    info = PromptInfo(
        source=counter.source,
        format="chat" if config.chat else "text",
        checked=len(got),
        exact=sum(g == config.prompt for g in got),
        max_off=off,
        calibration_requests=getattr(counter, "requests", 0),
        tokenizer=config.tokenizer,
    )
    return Prompts(shared_words=shared_words, own_words=own, info=info)


def _count_fn(counter: Counter, chat: bool) -> Callable[[str], int]:
    if chat:
        return lambda text: counter.chat([{"role": "user", "content": text}])
    return counter.text
