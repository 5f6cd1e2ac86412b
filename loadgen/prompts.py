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
# A guard on fit_text's counts (see fit_text for the counts it takes), for a tokenizer whose
# counts neither add up word by word nor grow with the text.
_MAX_FIT_COUNTS = 40
# fit_text's sample: at most this many words, and at most one word per _SAMPLE_SHARE tokens of
# the target (seeded pseudo-words are up to ~4-5 tokens each), so the sample stays within it.
_SAMPLE_WORDS = 256
_SAMPLE_SHARE = 5
# Each estimate aims this share of the way to the target: a sample's tokens per word is off by a
# few percent (256 words of 2-9 letters), and a text past the target may be past the context.
_AIM = 0.9
# A gap this small is closed with one-token fillers, one count where counts add up.
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
    words needed from a sample, add seeded words until the gap is filler-sized, then close it
    with one-letter words (one token each in any real vocabulary).

    No text counted on the way is much longer than the target. A server without /tokenize
    counts by answering a request (UsageCounter) and refuses one past the model's context, and
    the seeded pseudo-words are often several tokens each (4.3 on average in the embedded
    model's vocabulary, over 1,000 words): a sample of one word per token of the target, as
    this once took, was counted at up to 4x the target and refused (HTTP 400) for any --prompt
    above a quarter of the context there. So the sample is a fifth of that, each text aims
    below the target by _AIM, and a text past it is only ever followed by shorter ones.

    Counts: the template, the sample, 1-3 texts of words (at most 2*log2 of the words between
    the two nearest counts once one went past the target, see _Prefixes.search), then 1 of
    fillers where they add a token each (2*log2 of the gap per rotation of them otherwise):
    3-6 with the embedded model's chat template, 8 at most over 31,000 seeded prompts of 1 to
    3,000 tokens; _MAX_FIT_COUNTS whatever the tokenizer.
    """
    budget = _Budget(count)
    try:
        return _fit(budget, target, seed, prefix)
    except _OutOfCounts:
        pass
    raise PromptError(
        f"could not make a chat prompt of exactly {target} tokens with the server's tokenizer;"
        " try another --prompt or --seed, or use completions mode"
    )


def _fit(count: _Budget, target: int, seed: str, prefix: str) -> str:
    base = count(prefix)
    if base > target:
        raise PromptError(
            f"the chat template alone is {base} tokens, more than --prompt {target};"
            " raise --prompt or use completions mode"
        )
    room = target - base
    # every word is at least one token, so never more than `room` words are needed
    words = seeded_words(seed, max(1, room))
    sample = max(1, min(_SAMPLE_WORDS, room // _SAMPLE_SHARE))
    fit = _Prefixes(count, target, prefix, words, base)
    if fit.probe(sample):
        return fit.text()
    counted = fit.got_hi if fit.hi is not None else fit.got_lo
    if fit.search(max(1.0, (counted - base) / sample), _AIM, enough=_FILL_MAX):
        return fit.text()
    # The gap under `fit.lo` words is filler-sized (or no word fits in it): fillers, searched
    # the same way, each rotation of them once (a filler merged with its neighbour or with the
    # template's text after it is another filler in the next rotation).
    chosen = words[: fit.lo]
    # room for fillers that merge (a token for several of them), at a token per count at most
    most = len(_FILLERS) * (target - fit.got_lo)
    for turn in range(len(_FILLERS)):
        fillers = [_FILLERS[(turn + i) % len(_FILLERS)] for i in range(most)]
        filled = _Prefixes(count, target, prefix, chosen + fillers, fit.got_lo, start=fit.lo)
        if filled.search(1.0, 1.0):
            return filled.text()
    raise _OutOfCounts


class _OutOfCounts(Exception):
    """fit_text spent its counts, or its searches, without meeting the target."""


class _Budget:
    """`count`, at most _MAX_FIT_COUNTS times."""

    def __init__(self, count: Callable[[str], int]) -> None:
        self._count = count
        self.used = 0

    def __call__(self, text: str) -> int:
        if self.used >= _MAX_FIT_COUNTS:
            raise _OutOfCounts
        self.used += 1
        return self._count(text)


class _Prefixes:
    """Counts of `prefix` and the first k of `items`, for k from `start`: the longest counted
    at or under the target (lo) and the shortest counted over it (hi, None before any)."""

    def __init__(self, count: _Budget, target: int, prefix: str, items: Sequence[str],
                 got_start: int, start: int = 0) -> None:
        self.count, self.target, self.prefix, self.items = count, target, prefix, items
        self.start, self.got_start = start, got_start
        self.lo, self.got_lo = start, got_start
        self.hi: int | None = None
        self.got_hi = 0

    def text(self) -> str:
        return _join(self.prefix, self.items[: self.lo])

    def probe(self, k: int) -> bool:
        """Count the first k items; True where that is the target (lo is then k)."""
        got = self.count(_join(self.prefix, self.items[:k]))
        if got <= self.target:
            self.lo, self.got_lo = k, got
        else:
            self.hi, self.got_hi = k, got
        return got == self.target

    def search(self, per_item: float, aim: float, enough: int = 0) -> bool:
        """Probe between lo and hi until a text counts the target (True), or until the gap
        under lo is at most `enough`, or no k is left between lo and hi (False).

        With no text past the target yet, each probe adds `aim` of the gap at the tokens per
        item counted so far. Once one is past it, each probe lies strictly between lo and hi,
        at the tokens per item between the two, and one that did not halve hi - lo is followed
        by one at the middle, which does: at most 2*log2(hi - lo) probes, and no text is
        counted twice. (fit_text once dropped as many words as tokens over: when the words it had
        added were denser than its estimate, it came back to the text it had left, added the
        same words again and went round until it gave up: 4 of 10,000 seeded prompts of the
        embedded model, 598 tokens among them.)
        """
        halve = False
        while self.target - self.got_lo > enough:
            gap = self.target - self.got_lo
            if self.hi is None:
                if self.lo >= len(self.items):
                    return False
                if self.lo > self.start:
                    per_item = max(1.0, (self.got_lo - self.got_start) / (self.lo - self.start))
                k = min(len(self.items), self.lo + max(1, int(aim * gap / per_item)))
                width = None
            else:
                width = self.hi - self.lo
                if width <= 1:
                    return False
                between = (self.got_hi - self.got_lo) / width
                k = self.lo + max(1, int(aim * gap / between))
                k = self.lo + width // 2 if halve else min(k, self.hi - 1)
            if self.probe(k):
                return True
            halve = width is not None and self.hi is not None and 2 * (self.hi - self.lo) > width
        return self.got_lo == self.target  # lo may be where the search began: the template alone


def _join(prefix: str, words: Sequence[str]) -> str:
    body = " ".join(words)
    return f"{prefix} {body}" if prefix and body else prefix or body
