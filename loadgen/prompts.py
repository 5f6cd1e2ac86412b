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
# fit_text's sample: at most this many words, and at most one word per _SAMPLE_SHARE tokens of
# the target (seeded pseudo-words are up to ~4-5 tokens each), so the sample stays within it.
_SAMPLE_WORDS = 256
_SAMPLE_SHARE = 5
# Each estimate aims this share of the way to the target: a sample's tokens per word is off by a
# few percent (256 words of 2-9 letters), and a text past the target may be past the context.
_AIM = 0.9
# A gap this small is closed with one-token fillers, one count.
_FILL_MAX = 64
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
    words needed from a sample, then add words, drop words or add one-letter words (one token
    each in any real vocabulary) until the count is right. A few counts per prompt.

    No text counted on the way is much longer than the target. A server without /tokenize
    counts by answering a request (UsageCounter) and refuses one past the model's context, and
    the seeded pseudo-words are often several tokens each (4.3 on average in the embedded
    model's vocabulary, over 1,000 words): a sample of one word per token of the target, as
    this once took, was counted at up to 4x the target and refused (HTTP 400) for any --prompt
    above a quarter of the context there. So the sample is a fifth of that, the first text aims
    below the target by _AIM, and the gap left is closed from below.
    """
    base = count(prefix)
    if base > target:
        raise PromptError(
            f"the chat template alone is {base} tokens, more than --prompt {target};"
            " raise --prompt or use completions mode"
        )
    room = target - base
    # every word is at least one token, so never more than `room` words are needed
    words = seeded_words(seed, max(1, room))
    sampled = words[: max(1, min(_SAMPLE_WORDS, room // _SAMPLE_SHARE))]
    per_word = max(1.0, (count(_join(prefix, sampled)) - base) / len(sampled))
    chosen = words[: int(_AIM * room / per_word)]
    for _ in range(_MAX_FIT_STEPS):
        got = count(_join(prefix, chosen))
        if got == target:
            return _join(prefix, chosen)
        if got > target:  # each word is a token or more: dropping as many words as tokens over
            chosen = chosen[: max(0, len(chosen) - (got - target))]
            continue
        gap = target - got
        if gap <= _FILL_MAX:
            chosen = chosen + [_FILLERS[i % len(_FILLERS)] for i in range(gap)]
            continue
        if chosen:  # what these words really took, a better estimate than the sample's
            per_word = max(1.0, (got - base) / len(chosen))
        more = words[len(chosen) : len(chosen) + max(1, int(_AIM * gap / per_word))]
        chosen = chosen + (more or [_FILLERS[i % len(_FILLERS)] for i in range(gap)])
    raise PromptError(
        f"could not make a chat prompt of exactly {target} tokens with the server's tokenizer;"
        " try another --prompt or --seed, or use completions mode"
    )


def _join(prefix: str, words: Sequence[str]) -> str:
    body = " ".join(words)
    return f"{prefix} {body}" if prefix and body else prefix or body
