"""Exact counts against the real vLLM CPU engine (embedded tiny model), as a user runs loadgen."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.loadgen.conftest import run_cli

pytestmark = pytest.mark.stack


def _rows(path: Path) -> list[tuple[Any, Any, Any]]:
    data = json.loads(path.read_text())
    return [(r["prompt_tokens"], r["completion_tokens"], r["error"]) for r in data["requests"]]


def test_prompt_512_gen_256_through_the_proxy_is_exact(stack: Any, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    result = run_cli(
        "--url",
        stack.proxy_url,
        "--prompt",
        "512",
        "--gen",
        "256",
        "--requests",
        "3",
        "--json",
        str(out),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert _rows(out) == [(512, 256, None)] * 3
    summary = json.loads(out.read_text())["summary"]
    assert summary["requests_ok"] == 3
    assert summary["prefill_tok_s"]["p50"] > 0
    assert summary["decode_tok_s"]["p50"] > 0
    assert json.loads(out.read_text())["config"]["model"] == stack.model


@pytest.mark.parametrize("url_attr", ["vllm_url", "proxy_url"])
def test_chat_mode_is_exact_with_the_real_chat_template(
    stack: Any, tmp_path: Path, url_attr: str
) -> None:
    out = tmp_path / "chat.json"
    result = run_cli(
        "--url",
        getattr(stack, url_attr),
        "--chat",
        "--prompt",
        "200",
        "--gen",
        "24",
        "--requests",
        "3",
        "--concurrency",
        "3",
        "--json",
        str(out),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert _rows(out) == [(200, 24, None)] * 3


def test_a_context_too_short_is_refused_by_the_real_engine_limits(stack: Any) -> None:
    result = run_cli("--url", stack.vllm_url, "--prompt", "4000", "--gen", "256")
    assert result.returncode == 1
    assert "shorter than --prompt 4000 + --gen 256" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("chat", [False, True])
def test_a_local_tokenizer_gives_exact_text_prompts_on_real_vllm(
    stack: Any, tmp_path: Path, chat: bool
) -> None:
    # what loadgen does against a server without /tokenize, checked by vLLM's own usage
    out = tmp_path / "tok.json"
    result = run_cli(
        "--url", stack.vllm_url, "--tokenizer", stack.model_path,
        *(["--chat"] if chat else []),
        "--prompt", "300", "--gen", "16", "--requests", "3", "--concurrency", "3",
        "--json", str(out),
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert _rows(out) == [(300, 16, None)] * 3
    prompts = json.loads(out.read_text())["prompts"]
    assert (prompts["source"], prompts["format"]) == ("tokenizer", "chat" if chat else "text")


@pytest.mark.parametrize("through", ["engine", "proxy"])
def test_agent_sessions_on_real_vllm_count_exactly_and_hit_its_prefix_cache(
    stack: Any, tmp_path: Path, through: str
) -> None:
    # Through the proxy the run-wide counters come from its re-export of the engine's
    # (toposerve_engine_prefix_cache_*), with no --metrics-url.
    out = tmp_path / "agent.json"
    url = stack.vllm_url if through == "engine" else stack.proxy_url
    result = run_cli(
        "--url", url, "--workload", "agent", "--sessions", "2", "--turns", "3",
        "--context", "300:1200", "--gen", "8", "--think", "0.2", "--json", str(out),
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert all(r["error"] is None for r in data["requests"])
    assert all(r["prompt_tokens"] == r["prompt_expected"] for r in data["requests"])
    agent = data["agent"]
    assert [t["requests_ok"] for t in agent["per_turn"]] == [2, 2, 2]
    # vLLM's own counters: turns 2 and 3 resend what turns 1 and 2 sent
    assert "metrics" in agent["cache_source"].split("+")
    assert agent["prefix_cache"]["hit_rate"] > 0.3
    if "usage" in agent["cache_source"]:  # this vLLM also reports usage's cached_tokens
        later = [t["cache_hit_rate"] for t in agent["per_turn"][1:]]
        assert all(rate is not None and rate > 0.3 for rate in later)


def test_depth_runs_on_real_vllm_are_exact_and_find_the_context_in_its_prefix_cache(
    stack: Any, tmp_path: Path
) -> None:
    out = tmp_path / "depth.json"
    result = run_cli(
        "--url", stack.vllm_url, "--depth", "0,1k,2K", "--prompt", "64", "--gen", "8",
        "--requests", "3", "--json", str(out), "--no-progress",
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    runs = json.loads(out.read_text())["runs"]
    assert [r["depth"]["tokens"] for r in runs] == [0, 1000, 2048]
    for run in runs:
        depth = run["depth"]["tokens"]
        assert run["warmup"]["requests"] == 2  # the default, before measuring
        assert run["warmup"]["ok"] == 2
        # exact: vLLM's usage counts the context and the new tokens, every request
        assert {(r["prompt_tokens"], r["completion_tokens"]) for r in run["requests"]} == {
            (depth + 64, 8)
        }
        cached = [r["cached_tokens"] for r in run["requests"]]
        assert all(c is not None for c in cached), "vLLM gave no prompt_tokens_details"
        # vLLM caches whole blocks (at most 128 tokens on the CPU engine): the shared context
        # less at most one block; nothing of the new tokens, which no request repeats
        assert all(max(0, depth - 128) <= c <= depth for c in cached), (depth, cached)
        assert run["depth"]["cached_reported"] == 3
        assert run["depth"]["prefill_new_tok_s"]["p50"] > 0
        # a decode rate needs tokens after the first event on the client's clock: where the
        # CPU engine, on a busy machine, sent a request's 8 tokens in one event, or several
        # events reached the client in one read (no time between them), it has none and says
        # so (None); never 0 or a rate without a second event
        for r in run["requests"]:
            if r["chunks"] >= 2:
                assert r["decode_tok_s"] is None or r["decode_tok_s"] > 0, r
            else:
                assert r["decode_tok_s"] is None, r
        if any(r["decode_tok_s"] is not None for r in run["requests"]):
            assert run["summary"]["decode_tok_s"]["p50"] > 0
    assert runs[0]["depth"]["prime"] is None  # no context to cache at depth 0
    assert runs[2]["depth"]["prime"]["prompt_tokens"] == 2048 + 64


def test_cold_depth_on_real_vllm_finds_nothing_of_its_context_cached(
    stack: Any, tmp_path: Path
) -> None:
    out = tmp_path / "cold.json"
    result = run_cli(
        "--url", stack.vllm_url, "--depth", "2k", "--depth-cold", "--prompt", "64", "--gen", "8",
        "--requests", "3", "--json", str(out), "--no-progress",
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["depth"]["mode"] == "cold"
    assert data["depth"]["prime"] is None
    assert {r["prompt_tokens"] for r in data["requests"]} == {2064}
    assert {r["cached_tokens"] for r in data["requests"]} == {0}


def test_an_agent_soak_on_real_vllm_grows_until_the_tokens_asked_with_exact_counts(
    stack: Any, tmp_path: Path
) -> None:
    out = tmp_path / "soak.json"
    result = run_cli(
        "--url", stack.vllm_url, "--workload", "agent", "--sessions", "2", "--context", "600",
        "--soak-tokens", "3k", "--turn-tokens", "600", "--gen", "8", "--think", "0.1",
        "--json", str(out), "--no-progress",
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    agent = data["agent"]
    assert (agent["turns"], agent["context"]) == (5, [600, 3000])
    assert all(r["prompt_tokens"] == r["prompt_expected"] for r in data["requests"])
    assert agent["per_turn"][-1]["prompt_tokens"]["min"] >= 2900
    assert all(t["ttft_s"]["p50"] > 0 for t in agent["per_turn"])
    # turn t resends turn t-1's prompt (600 (t-1) of 600 t tokens): vLLM's cache serves most of
    # that, less the block it rounds down to and the previous turn's generation prompt (one run
    # read 0.43, 0.64, 0.74, 0.77 for turns 2-5 against 0.50, 0.67, 0.75, 0.80 at most)
    rates = [t["cache_hit_rate"] for t in agent["per_turn"]]
    for turn, rate in enumerate(rates[1:], start=2):
        assert rate is not None
        assert rate > 0.6 * (turn - 1) / turn, rates
    assert data["warmup"]["requests"] == 2
