"""Seeded prompts of an exact token count (pure; the tokenizer is passed in as a function).

Completions get token ids, so their length is exact by construction. The ids come from a pool
made by tokenizing seeded text on the target itself, so every id is one the model's vocabulary
really has (the tiny embedded model has a few thousand; a random id could be out of range).
Each request draws its own ids so the prefix cache cannot fake prefill speed, except for the
first `shared_prefix` ids, which every request shares when asked to. The prompt length is part
of the seed: a 3,584-token prompt must not begin with the 512-token prompt of the same index.

Chat requests go through the model's chat template, so their text is adjusted word by word,
counted by the server's /tokenize, until the templated prompt is exactly the target length.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Sequence

from loadgen.errors import PromptError

_LETTERS = string.ascii_lowercase
_MAX_FIT_STEPS = 40
# Short words that are one token in every vocabulary worth benchmarking.
_FILLERS = ("a", "i", "o", "e")


def seeded_words(seed: str, count: int) -> list[str]:
    """`count` pseudo-words of 2-9 lowercase letters, the same for the same seed."""
    rng = random.Random(seed)
    return ["".join(rng.choices(_LETTERS, k=rng.randint(2, 9))) for _ in range(count)]


def seeded_text(seed: str, words: int) -> str:
    return " ".join(seeded_words(seed, words))


def token_pool(ids: Sequence[int], avoid: Sequence[int] = ()) -> tuple[int, ...]:
    """Distinct ids to draw prompts from, without the special ones in `avoid`."""
    banned = set(avoid)
    pool = tuple(sorted({i for i in ids if i not in banned}))
    if len(pool) < 2:
        raise PromptError(
            "the server's tokenizer gave fewer than 2 distinct token ids for sample text;"
            " use --chat, or check /tokenize on the server"
        )
    return pool


def prompt_ids(pool: Sequence[int], length: int, seed: str, index: int, shared: int) -> list[int]:
    """Token ids of request `index`: `shared` ids common to all requests, then its own."""
    prefix = random.Random(f"{seed}:shared").choices(pool, k=shared)
    own = random.Random(f"{seed}:{length}:{index}").choices(pool, k=length - shared)
    return prefix + own


def fit_text(count: Callable[[str], int], target: int, seed: str, prefix: str = "") -> str:
    """Text whose templated token count (`count`) is exactly `target`.

    Tokenizers split on spaces before merging, so counts add up word by word: estimate the
    words needed from one sample, then drop words or add one-letter words (one token each in
    any real vocabulary) until the count is right. A few /tokenize calls per prompt.
    """
    base = count(prefix)
    if base > target:
        raise PromptError(
            f"the chat template alone is {base} tokens, more than --prompt {target};"
            " raise --prompt or use completions mode"
        )
    words = seeded_words(seed, max(1, target - base))
    sample = count(_join(prefix, words))
    per_word = max(1.0, (sample - base) / len(words))
    chosen = words[: int((target - base) / per_word)]
    for _ in range(_MAX_FIT_STEPS):
        got = count(_join(prefix, chosen))
        if got == target:
            return _join(prefix, chosen)
        if got < target:
            chosen = chosen + [_FILLERS[i % len(_FILLERS)] for i in range(target - got)]
        else:
            chosen = chosen[: max(0, len(chosen) - (got - target))]
    raise PromptError(
        f"could not make a chat prompt of exactly {target} tokens with the server's tokenizer;"
        " try another --prompt or --seed, or use completions mode"
    )


def _join(prefix: str, words: Sequence[str]) -> str:
    body = " ".join(words)
    return f"{prefix} {body}" if prefix and body else prefix or body
