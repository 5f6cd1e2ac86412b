"""Seeded prompts of exact length (pure; the tokenizer is a plain function here)."""

from __future__ import annotations

import pytest

from loadgen.cli import build_parser, config_from
from loadgen.errors import PromptError
from loadgen.prompts import fit_text, prompt_ids, seeded_words, token_pool

POOL = tuple(range(100, 140))


def test_prompt_ids_have_exact_length_and_valid_ids() -> None:
    ids = prompt_ids(POOL, 512, "0", 7, 0)
    assert len(ids) == 512
    assert set(ids) <= set(POOL)


def test_prompts_differ_per_request_and_repeat_per_seed() -> None:
    a, b = prompt_ids(POOL, 64, "0", 1, 0), prompt_ids(POOL, 64, "0", 2, 0)
    assert a != b
    assert a[:16] != b[:16]  # the first KV block already differs: no prefix-cache hit
    assert prompt_ids(POOL, 64, "0", 1, 0) == a
    assert prompt_ids(POOL, 64, "1", 1, 0) != a


def test_a_longer_prompt_does_not_begin_with_the_shorter_prompt_of_the_same_request() -> None:
    # found on the GPU: a 3,584-token run after a 512-token run (same seed) met its first 512
    # tokens in vLLM's prefix cache and overstated prefill
    short, long = prompt_ids(POOL, 512, "0", 1, 0), prompt_ids(POOL, 3584, "0", 1, 0)
    assert long[:16] != short[:16]


def test_runs_without_a_seed_get_fresh_prompts_and_an_explicit_seed_repeats_them() -> None:
    a, b = build_parser().parse_args([]), build_parser().parse_args([])
    first, second = config_from(a), config_from(b)
    assert first.seed != second.seed  # 31 random bits: a clash is a one-in-a-billion event
    one, two = (prompt_ids(POOL, 64, str(c.seed), 1, 0) for c in (first, second))
    assert one != two
    again = [config_from(build_parser().parse_args(["--seed", "7"])) for _ in range(2)]
    assert again[0].seed == again[1].seed == 7


def test_shared_prefix_is_common_and_the_rest_is_not() -> None:
    a, b = prompt_ids(POOL, 64, "0", 1, 32), prompt_ids(POOL, 64, "0", 2, 32)
    assert a[:32] == b[:32]
    assert a[32:] != b[32:]


def test_token_pool_drops_special_ids_and_needs_variety() -> None:
    assert token_pool([5, 3, 5, 1, 2], avoid=[1]) == (2, 3, 5)
    with pytest.raises(PromptError):
        token_pool([7, 7, 7])


def _counter(overhead: int, tokens_per_word: dict[int, int]) -> tuple[list[str], object]:
    """A tokenizer where a word of length L is tokens_per_word.get(L, 2) tokens."""
    calls: list[str] = []

    def count(text: str) -> int:
        calls.append(text)
        return overhead + sum(tokens_per_word.get(len(w), 2) for w in text.split())

    return calls, count


@pytest.mark.parametrize("target", [1 + 7, 64, 512, 1000])
@pytest.mark.parametrize("per_word", [{1: 1}, {1: 1, 2: 1, 3: 1}, {1: 1, 9: 5, 8: 4}])
def test_fit_text_hits_the_exact_templated_count(target: int, per_word: dict[int, int]) -> None:
    calls, count = _counter(7, per_word)
    text = fit_text(count, target, "s")  # type: ignore[arg-type]
    assert count(text) == target  # type: ignore[operator]
    assert len(calls) < 12  # a few /tokenize calls, not a search over every length


def test_fit_text_refuses_when_the_template_alone_is_too_long() -> None:
    _, count = _counter(20, {})
    with pytest.raises(PromptError, match="chat template alone is 20 tokens"):
        fit_text(count, 10, "s")  # type: ignore[arg-type]


def test_seeded_words_are_deterministic() -> None:
    assert seeded_words("x", 5) == seeded_words("x", 5)
    assert seeded_words("x", 5) != seeded_words("y", 5)


@pytest.mark.parametrize("target", [512, 1000, 4000, 30000])
@pytest.mark.parametrize("per_word", [{1: 1}, {1: 1, 2: 1, 3: 1}, {1: 1, 9: 5, 8: 5, 7: 4, 6: 4}])
def test_fitting_never_counts_a_text_longer_than_the_target(
    target: int, per_word: dict[int, int]
) -> None:
    """A server without /tokenize counts by answering, and refuses a text past the model's
    context: calibrating a prompt near the context must not count a longer one (the sample of
    one pseudo-word per target token was 2-5x the target: HTTP 400 at --prompt 3000 of 4096)."""
    calls, count = _counter(7, per_word)
    text = fit_text(count, target, "s")  # type: ignore[arg-type]
    fitting = list(calls)
    assert len(fitting) < 12
    assert count(text) == target  # type: ignore[operator]
    assert max(count(c) for c in fitting) <= target  # type: ignore[operator]
