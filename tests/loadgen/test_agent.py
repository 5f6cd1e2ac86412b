"""--workload agent: growing conversations per session, per-turn results, prefix-cache hits."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadgen.agent import (
    build_conversations,
    cache_counters,
    cache_delta,
    context_for,
    turn_targets,
)
from loadgen.config import Config
from loadgen.errors import ContextTooShort
from loadgen.tokens import Messages
from tests.loadgen.conftest import run_cli
from tests.loadgen.standin import spawn

TEMPLATE = 5  # tokens the fake template adds per message
GEN_PROMPT = 3


class WordCounter:
    """A tokenizer stand-in: one token per word, a fixed template cost per message."""

    source = "tokenizer"
    exact = True

    def text(self, prompt: str) -> int:
        return len(prompt.split())

    def chat(self, messages: Messages) -> int:
        words = sum(len(str(m["content"]).split()) for m in messages)
        return words + TEMPLATE * len(messages) + GEN_PROMPT


def test_turn_targets_grow_linearly_from_first_to_last() -> None:
    assert turn_targets(2000, 30000, 10)[0] == 2000
    assert turn_targets(2000, 30000, 10)[-1] == 30000
    steps = {
        b - a
        for a, b in zip(turn_targets(100, 1000, 10), turn_targets(100, 1000, 10)[1:], strict=False)
    }
    assert steps == {100}
    assert turn_targets(500, 900, 1) == [500]


def test_the_default_context_is_capped_to_the_model() -> None:
    assert context_for(Config(gen=64), None, "m") == (2000, 30000)
    assert context_for(Config(gen=64), 4096, "m") == (1975, 3951)  # the embedded model
    assert context_for(Config(gen=64), 2048, "m") == (960, 1920)


def test_a_context_past_the_model_is_refused_before_sending() -> None:
    with pytest.raises(ContextTooShort, match="lower --context or --gen"):
        context_for(Config(gen=64, context=(2000, 30000)), 4096, "m")


def test_each_turn_resends_the_whole_history_and_sessions_share_only_the_system_prompt() -> None:
    cfg = Config(sessions=3, turns=5, gen=16, context=(200, 1000), seed=1)
    conversations, counts = build_conversations(WordCounter(), cfg, (200, 1000))
    for session in conversations:
        for before, after in itertools.pairwise(session):
            assert list(after[: len(before)]) == list(before)  # appended, never rewritten
            assert [m["role"] for m in after[len(before) :]] == ["assistant", "user"]
    systems = {s[0][0]["content"] for s in conversations}
    files = {s[0][1]["content"] for s in conversations}
    assert len(systems) == 1
    assert len(files) == 3
    for session, row in zip(conversations, counts, strict=False):
        assert list(row) == [WordCounter().chat(m) for m in session]  # counted, exactly
        assert abs(row[0] - 200) <= 2
        assert abs(row[-1] - 1000) <= 10


def test_cache_counters_are_read_with_or_without_the_total_suffix() -> None:
    text = (
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{engine="0"} 100.0\n'
        'vllm:prefix_cache_queries_total{engine="1"} 50.0\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{engine="0"} 30.0\n'
    )
    after = cache_counters(text)
    assert after is not None
    assert (after.queries, after.hits) == (150.0, 30.0)
    before = cache_counters("vllm:prefix_cache_queries 50\nvllm:prefix_cache_hits 10\n")
    assert cache_delta(before, after) == {"queries": 100.0, "hits": 20.0, "hit_rate": 0.2}
    assert cache_counters("toposerve_requests_total 3\n") is None
    assert cache_counters("not { metrics") is None


@pytest.fixture(scope="module")
def cached(tiny_model_path: str) -> Iterator[str]:
    args = ("--tokenizer", tiny_model_path, "--cached-tokens", "--ttft", "0.01", "--itl", "0.001")
    with spawn(*args) as url:
        yield url


def _agent(url: str, out: Path, *args: str) -> tuple[int, str, str, dict[str, Any]]:
    result = run_cli(
        "--url", url, "--workload", "agent", "--sessions", "3", "--turns", "4",
        "--context", "300:900", "--gen", "8", "--think", "0.05", "--json", str(out),
        "--no-progress", *args,
    )  # fmt: skip
    data = json.loads(out.read_text()) if out.exists() else {}
    return result.returncode, result.stdout, result.stderr, data


@pytest.mark.parametrize("counting", ["tokenizer", "usage"])
def test_agent_sessions_report_per_turn_new_tokens_and_cache_hits(
    cached: str, tiny_model_path: str, tmp_path: Path, counting: str
) -> None:
    extra = ("--tokenizer", tiny_model_path) if counting == "tokenizer" else ()
    code, stdout, stderr, data = _agent(cached, tmp_path / "a.json", *extra)
    assert code == 0, stderr
    agent = data["agent"]
    assert (agent["sessions"], agent["turns"], agent["context"]) == (3, 4, [300, 900])
    turns = agent["per_turn"]
    assert [t["turn"] for t in turns] == [1, 2, 3, 4]
    assert all(t["requests_ok"] == 3 for t in turns)
    # new tokens: the whole first prompt, then what each turn appended (~200)
    assert turns[0]["new_tokens"]["mean"] == turns[0]["prompt_tokens"]["mean"]
    for t in turns[1:]:
        assert 150 <= t["new_tokens"]["mean"] <= 250
        assert t["prefill_new_tok_s"]["p50"] > 0
    # the stand-in caches whole blocks of earlier prompts: later turns hit more
    rates = [t["cache_hit_rate"] for t in turns]
    assert all(r is not None for r in rates)
    assert rates[1] > rates[0]
    assert rates[3] > rates[1]
    assert agent["cache_source"] == "usage+metrics"
    assert agent["prefix_cache"]["hit_rate"] > 0
    assert data["prompts"]["source"] == counting
    for r in data["requests"]:
        assert r["error"] is None
        if counting == "tokenizer":
            assert r["prompt_tokens"] == r["prompt_expected"]  # counted exactly, checked
    assert "agent: TTFT p50 of turn 4" in stdout


def test_a_session_sends_its_next_turn_only_after_the_previous_one_and_its_think_time(
    cached: str, tiny_model_path: str, tmp_path: Path
) -> None:
    code, _, stderr, data = _agent(cached, tmp_path / "a.json", "--tokenizer", tiny_model_path)
    assert code == 0, stderr
    rows = sorted(data["requests"], key=lambda r: r["index"])
    for session in range(3):
        mine = rows[session * 4 : session * 4 + 4]
        for before, after in itertools.pairwise(mine):
            assert after["t_sent_s"] >= before["t_end_s"] + 0.05
    assert data["summary"]["max_in_flight"] <= 3


def test_agent_flags_that_make_no_sense_together_are_refused(cached: str) -> None:
    result = run_cli("--url", cached, "--workload", "agent", "--sweep", "1,2")
    assert result.returncode == 2
    assert "--workload agent sets its own load" in result.stderr
    result = run_cli("--url", cached, "--workload", "agent", "--context", "9:3")
    assert result.returncode == 2
    assert "FIRST:LAST" in result.stderr


@pytest.mark.parametrize(("source", "said"), [(None, True), ("metrics", True), ("usage", False),
                                              ("usage+metrics", False)])
def test_a_server_without_cached_tokens_in_usage_is_told_beside_the_empty_hit_column(
    source: str | None, said: bool
) -> None:
    """The per-turn 'cache hit' column reads usage's cached_tokens; a server that gives none
    (the simulated engine, vLLM without --enable-prompt-tokens-details) shows '-' in every row,
    which needs the reason, as the depth lines give it."""
    from loadgen.agent import AgentResult, TurnResult
    from loadgen.outputs.report import format_agent_notes
    from loadgen.stats import dist

    one = dist([0.1])
    turn = TurnResult(1, 2, 0, one, one, one, one, one, None, None)
    pc = {"hit_rate": 0.5, "queries": 100.0} if source and "metrics" in source else None
    notes = format_agent_notes(AgentResult(2, 1, (100, 300), 0.0, (turn,), pc, source))
    told = [n for n in notes if n.startswith("cache hit per turn: the server reported no")]
    assert bool(told) == said
