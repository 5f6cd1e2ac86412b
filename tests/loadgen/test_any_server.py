"""loadgen against an OpenAI-compatible server that is not vLLM (no /tokenize): the stand-in
counts prompts with the embedded model's real tokenizer, as llama.cpp, SGLang or TGI would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.loadgen.conftest import run_cli
from tests.loadgen.standin import spawn

GEN = 12


@pytest.fixture(scope="module")
def plain(tiny_model_path: str) -> Iterator[str]:
    with spawn("--tokenizer", tiny_model_path, "--ttft", "0.02", "--itl", "0.002") as url:
        yield url


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _rows(data: dict[str, Any]) -> list[tuple[Any, Any, Any]]:
    return [(r["prompt_tokens"], r["completion_tokens"], r["error"]) for r in data["requests"]]


def _run(url: str, out: Path, *args: str) -> tuple[int, str, str]:
    result = run_cli(
        "--url",
        url,
        "--gen",
        str(GEN),
        "--requests",
        "4",
        "--concurrency",
        "2",
        "--json",
        str(out),
        "--no-progress",
        *args,
    )
    return result.returncode, result.stdout, result.stderr


def test_the_stand_in_really_has_no_tokenize(plain: str) -> None:
    assert httpx.post(f"{plain}/tokenize", json={"prompt": "a"}).status_code == 404


@pytest.mark.parametrize("chat", [False, True])
def test_a_local_tokenizer_makes_exact_prompts_without_tokenize(
    plain: str, tiny_model_path: str, tmp_path: Path, chat: bool
) -> None:
    out = tmp_path / "r.json"
    code, stdout, stderr = _run(
        plain, out, "--prompt", "300", "--tokenizer", tiny_model_path, *(["--chat"] if chat else [])
    )
    assert code == 0, stderr
    data = _load(out)
    assert _rows(data) == [(300, GEN, None)] * 4
    assert data["prompts"]["source"] == "tokenizer"
    assert data["prompts"]["format"] == ("chat" if chat else "text")
    assert data["prompts"]["exact"] == data["prompts"]["checked"] == 4
    assert "counted by the tokenizer" in stdout


@pytest.mark.parametrize("chat", [False, True])
def test_without_any_tokenizer_prompts_are_calibrated_from_usage(
    plain: str, tmp_path: Path, chat: bool
) -> None:
    out = tmp_path / "r.json"
    code, stdout, stderr = _run(plain, out, "--prompt", "200", *(["--chat"] if chat else []))
    assert code == 0, stderr
    data = _load(out)
    info = data["prompts"]
    assert info["source"] == "usage"
    assert info["calibration_requests"] > 0
    assert "calibrated from the server's usage" in stdout
    # byte-level BPE splits on spaces first, so the shuffles keep the calibrated count
    assert info["exact"] == info["checked"] == 4
    assert _rows(data) == [(200, GEN, None)] * 4
    assert all(r["prompt_expected"] == 200 for r in data["requests"])


@pytest.mark.parametrize("args", [("--prompt", "3000"), ("--prompt", "3000", "--chat"),
                                  ("--workload", "agent", "--sessions", "1", "--turns", "2",
                                   "--think", "0")])
def test_prompts_near_the_models_context_are_calibrated_from_usage_without_a_refusal(
    plain: str, tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Calibrating from usage counts by sending: no text counted on the way may be past the
    stand-in's 4096-token context (before: one seeded word per target token, 4.3 tokens each
    in the embedded model's vocabulary, answered HTTP 400)."""
    out = tmp_path / "r.json"
    code, _, stderr = _run(plain, out, *args)
    assert code == 0, stderr
    data = _load(out)
    assert data["prompts"]["source"] == "usage"
    assert all(r["error"] is None for r in data["requests"])
    if "--prompt" in args:
        assert {r["prompt_tokens"] for r in data["requests"]} == {3000}
    else:  # the default context capped to the model's: the last turn close to its 4096
        assert max(r["prompt_tokens"] for r in data["requests"]) > 3900


def test_every_request_prompt_differs_so_no_prefix_cache_flatters_it(
    plain: str, tiny_model_path: str, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    before = _cache_hits(plain)
    code, _, stderr = _run(plain, out, "--prompt", "300", "--tokenizer", tiny_model_path)
    assert code == 0, stderr
    # the stand-in's cache counts whole 16-token blocks shared with an earlier prompt: the
    # first word is common to all (it stays first), so at most one block may hit
    assert _cache_hits(plain) - before <= 16 * 4


def _cache_hits(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total"):
            return float(line.split()[-1])
    raise AssertionError("no hits counter")


def test_a_server_without_usage_is_counted_by_the_tokenizer_not_by_events(
    tiny_model_path: str, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    args = ("--tokenizer", tiny_model_path, "--no-usage", "--tokens-per-chunk", "2")
    with spawn(*args, "--itl", "0.004", "--ttft", "0.02") as url:
        code, stdout, stderr = _run(url, out, "--prompt", "64", "--tokenizer", tiny_model_path)
    assert code == 0, stderr
    data = _load(out)
    assert _rows(data) == [(64, GEN, None)] * 4  # 12 tokens in 6 events: not 6
    assert {r["counted_by"] for r in data["requests"]} == {"tokenizer"}
    requests = data["requests"]
    assert {r["chunks"] for r in requests} == {GEN // 2}
    # Each event's tokens were counted by the tokenizer (2), not spread by a mean...
    assert not any(r["itl_even"] for r in requests)
    # ...and each token after the first event is one ITL sample (2 per event gap, not 1) whose
    # share is its event's gap over its 2 tokens (g/2, not g): the samples add up to the time
    # from the first token event to the last, which the decode rate measures over GEN - 2
    # tokens. Relations of one run's readings, not the stand-in's 4 ms: on loaded cores its
    # events come late and unevenly, and two read at once have a true gap of 0 (the exact
    # split, never a 0 for tokens of one event, is tests/loadgen/test_timing.py's).
    itl = data["summary"]["itl_s"]
    assert itl["n"] == len(requests) * (GEN - 2)
    streamed = sum((GEN - 2) / r["decode_tok_s"] for r in requests)
    assert itl["mean"] * itl["n"] == pytest.approx(streamed)
    assert "output counted by the tokenizer" in stdout


def test_two_token_events_with_usage_keep_exact_counts_and_spread_itl(
    tiny_model_path: str, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    with spawn("--tokenizer", tiny_model_path, "--tokens-per-chunk", "2", "--itl", "0.004") as url:
        code, stdout, stderr = _run(url, out, "--prompt", "64")
    assert code == 0, stderr
    data = _load(out)
    assert _rows(data) == [(64, GEN, None)] * 4
    requests = data["requests"]
    assert {r["chunks"] for r in requests} == {GEN // 2}
    # Usage says 12 tokens came in 6 events, nothing says how each event split them: every gap
    # between events is spread over the mean 2 tokens, one sample g/2 per gap (not g, and no 0
    # sample beside it for an event's second token)...
    assert all(r["itl_even"] for r in requests)
    itl = data["summary"]["itl_s"]
    assert itl["n"] == len(requests) * (GEN // 2 - 1)
    # ...so the samples add up to half the time from the first token event to the last, which
    # the decode rate measures over the GEN - 2 tokens after the first event. Relations of one
    # run's readings, not the stand-in's 8 ms between events: on loaded cores two events read at
    # once have a true gap of 0 (itl min 0.0 in 1 of 60 runs beside two busy loops), and all
    # six, no decode rate (a span of 0, whose samples are all 0).
    spans = sum((GEN - 2) / r["decode_tok_s"] for r in requests if r["decode_tok_s"])
    assert itl["mean"] * itl["n"] == pytest.approx(spans / 2)
    assert "several tokens per event" in stdout


def test_no_usage_and_no_tokenizer_is_a_one_line_error(
    tiny_model_path: str, tmp_path: Path
) -> None:
    with spawn("--tokenizer", tiny_model_path, "--no-usage") as url:
        code, _, stderr = _run(url, tmp_path / "r.json")
    assert code == 1
    assert "without usage.prompt_tokens" in stderr
    assert "--tokenizer" in stderr
    assert "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_a_tokenizer_that_cannot_be_loaded_is_a_one_line_error(plain: str, tmp_path: Path) -> None:
    code, _, stderr = _run(plain, tmp_path / "r.json", "--tokenizer", str(tmp_path / "nothing"))
    assert code == 2
    assert "cannot load tokenizer" in stderr
    assert "Traceback" not in stderr


def test_offline_hub_id_that_is_not_cached_is_refused_in_one_line(
    plain: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code, _, stderr = _run(plain, tmp_path / "r.json", "--tokenizer", "no-such-org/no-such-model")
    assert code == 2
    assert "cannot load tokenizer 'no-such-org/no-such-model'" in stderr
    assert "Traceback" not in stderr


def test_pptg_needs_token_ids_and_says_so_against_a_server_without_tokenize(
    plain: str, tiny_model_path: str
) -> None:
    result = run_cli("--url", plain, "--pptg", "-r", "1", "--tokenizer", tiny_model_path)
    assert result.returncode == 1
    assert "--pptg sends token-id prompts" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_hub_id_already_under_hf_home_loads_offline(
    plain: str, tiny_model_path: str, tmp_path: Path
) -> None:
    import os

    # huggingface_hub's cache layout, as a download would have left it
    repo = tmp_path / "hf" / "hub" / "models--toposerve--tiny-tokenizer"
    commit = "0" * 39 + "1"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        (snapshot / name).write_bytes((Path(tiny_model_path) / name).read_bytes())
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env = {**base, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "r.json"
    result = run_cli(
        "--url", plain, "--chat", "--prompt", "200", "--gen", "4", "--requests", "2",
        "--tokenizer", "toposerve/tiny-tokenizer", "--json", str(out), env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert _rows(_load(out)) == [(200, 4, None)] * 2
    assert _load(out)["prompts"]["tokenizer"] == "toposerve/tiny-tokenizer"


def test_a_server_that_refuses_vllms_length_fields_is_measured_without_them(
    tiny_model_path: str, tmp_path: Path
) -> None:
    # OpenAI's API answers 400 "Unrecognized request argument supplied: ignore_eos"; the model
    # then stops where it likes (here after 3 tokens): that is a result, not a failure.
    out = tmp_path / "strict.json"
    with spawn("--tokenizer", tiny_model_path, "--strict-fields", "--eos-after", "3") as url:
        result = run_cli("--url", url, "--tokenizer", tiny_model_path, "--prompt", "64",
                         "--gen", "8", "--requests", "3", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "refused min_tokens/ignore_eos" in result.stdout
    data = json.loads(out.read_text())
    assert data["config"]["exact_length"] is False
    assert [(r["prompt_tokens"], r["completion_tokens"], r["error"]) for r in data["requests"]] \
        == [(64, 3, None)] * 3


def test_a_refused_control_request_names_its_route_once_and_the_servers_reason(
    plain: str,
) -> None:
    from loadgen.errors import TargetError
    from loadgen.target import TargetClient

    client = TargetClient(plain, None)
    try:
        with pytest.raises(TargetError) as refused:
            client.post("/v1/completions", {"model": "standin-model", "prompt": "a " * 5000,
                                            "max_tokens": 1})
    finally:
        client.close()
    said = str(refused.value)
    assert said.startswith(f"POST {plain}/v1/completions answered HTTP 400: ")
    assert said.count("/v1/completions") == 1
    assert "maximum context length" in said  # the stand-in's own words
