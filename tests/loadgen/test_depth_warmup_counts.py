"""Issue 24's loadgen fixes and depth runs, against simulated and stand-in servers where the
exact behaviour is the point: the default warm-up, a 4xx's own reason, a --tokenizer whose count
differs from the server's usage, --depth's token counts and labels, the agent soak."""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.config import Config, soaked
from loadgen.depth import DepthRun, parse_depths, parse_tokens, summarize_depth
from loadgen.errors import BadArgument
from loadgen.target import reason
from loadgen.timing import RequestResult
from simengine.engine import SimConfig, spawn
from tests.loadgen.conftest import run_cli
from tests.loadgen.standin import spawn as spawn_standin
from tests.support.prom import host_port, prometheus, pushgateway, scrape_config, wait_for

# ---- parsers (generated inputs) ---------------------------------------------------------


@given(st.integers(min_value=0, max_value=10**7))
def test_a_plain_token_count_is_itself(n: int) -> None:
    assert parse_tokens(str(n)) == n


@given(st.integers(min_value=0, max_value=10**5), st.sampled_from(["k", "K", "m", "M"]))
def test_lowercase_suffixes_are_decimal_and_uppercase_binary_as_in_vllm(n: int, s: str) -> None:
    factor = {"k": 1000, "K": 1024, "m": 10**6, "M": 2**20}[s]
    assert parse_tokens(f"{n}{s}") == n * factor


@given(st.decimals(min_value=0, max_value=1000, places=3, allow_nan=False, allow_infinity=False))
def test_a_decimal_with_k_is_taken_when_it_is_a_whole_number_of_tokens(d: Decimal) -> None:
    text = f"{d:f}k"
    value = d * 1000
    if value == value.to_integral_value():
        assert parse_tokens(text) == int(value)
    else:
        with pytest.raises(BadArgument, match="whole number"):
            parse_tokens(text)


@given(st.text(max_size=20))
def test_any_text_is_a_token_count_or_one_bad_argument(text: str) -> None:
    try:
        value: int | str = parse_tokens(text)
    except BadArgument as exc:
        value = str(exc)
    assert (isinstance(value, int) and value >= 0) or "\n" not in str(value)


@given(st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=6))
def test_a_depth_sweep_keeps_the_order_given(depths: list[int]) -> None:
    assert parse_depths(",".join(str(d) for d in depths)) == tuple(depths)


def _result(index: int, prompt: int, cached: int | None, ttft: float, error: str | None = None
            ) -> RequestResult:
    return RequestResult(index, prompt, 8, ttft, ttft + 0.1, prompt / ttft, 70.0, (), None, error,
                         cached_tokens=cached)


@given(
    st.integers(min_value=0, max_value=100_000),
    st.lists(
        st.tuples(st.integers(min_value=1, max_value=4096), st.floats(min_value=1e-3, max_value=9),
                  st.booleans()),
        min_size=1, max_size=8,
    ),
)
def test_a_level_at_depth_is_read_from_its_requests_usage(
    depth: int, rows: list[tuple[int, float, bool]]
) -> None:
    requests = [_result(i, depth + new, depth if hit else 0, ttft)
                for i, (new, ttft, hit) in enumerate(rows)]
    requests.append(_result(99, depth + 1, None, 1.0, error="HTTP 500: x"))  # never counted
    s = summarize_depth(DepthRun(depth, 0, cold=False), requests)
    assert s.cached_reported == len(rows)
    assert s.new_tokens.max == max(new for new, _, _ in rows)
    assert s.prefill_new_tok_s.max == pytest.approx(max(n / t for n, t, _ in rows))
    cached = sum(depth for _, _, hit in rows if hit)
    assert s.hit_rate == pytest.approx(cached / sum(depth + n for n, _, _ in rows))
    none = summarize_depth(DepthRun(depth, 0, cold=True), [_result(0, depth + 1, None, 1.0)])
    assert (none.cached_reported, none.hit_rate) == (0, None)


def test_a_cold_depth_says_the_rate_of_every_uncached_token_beside_the_new_tokens() -> None:
    """Cold, the server prefills the whole context: the new tokens' rate alone (128 tokens over
    the TTFT of 2,128) would read as a slow engine, not as what it computed."""
    from loadgen.outputs.report import format_depth_notes
    from loadgen.outputs.results import LevelResult
    from loadgen.stats import summarize

    requests = tuple(_result(i, 2128, 0, 1.0) for i in range(3))
    level = LevelResult(1, None, summarize(requests, (0.0, 3.0)), requests,
                        depth=DepthRun(2000, 128, cold=True))
    (line,) = format_depth_notes(level)
    assert "prefill of the 128 new tokens p50 128.0 tok/s" in line
    assert "of every uncached token p50 2,128.0 tok/s" in line


def test_a_cached_depth_whose_context_the_server_did_not_keep_says_so() -> None:
    """A server without prefix caching (vLLM --no-enable-prefix-caching) reports 0 cached
    tokens after the prime: the level asked for a cached context and measured a cold one."""
    from loadgen.outputs.report import format_depth_notes
    from loadgen.outputs.results import LevelResult
    from loadgen.stats import summarize

    def notes(cached: int) -> list[str]:
        requests = tuple(_result(i, 1128, cached, 0.5) for i in range(3))
        level = LevelResult(1, None, summarize(requests, (0.0, 3.0)), requests,
                            depth=DepthRun(1000, 128, cold=False))
        return format_depth_notes(level)

    missed = notes(0)[-1]
    assert missed.startswith("cached asked, but the measured requests found p50 0 of the"
                             " 1000-token context cached")
    assert "--enable-prefix-caching" in missed
    assert not any("cached asked" in line for line in notes(896))  # whole blocks of it: kept


def test_a_binary_suffix_with_decimals_is_refused_with_the_decimal_spelling() -> None:
    with pytest.raises(BadArgument, match=r"did you mean 1\.5k"):
        parse_tokens("1.5K")
    with pytest.raises(BadArgument, match="at least one"):
        parse_depths(" , ")


@given(
    st.integers(min_value=1, max_value=200_000),
    st.integers(min_value=1, max_value=20_000),
    st.integers(min_value=1, max_value=50_000),
)
def test_a_soak_grows_each_turn_by_the_step_until_it_crosses_the_tokens_asked(
    soak: int, step: int, first: int
) -> None:
    cfg = soaked(Config(workload="agent", soak_tokens=soak, turn_tokens=step), first)
    assert cfg.context is not None
    start, last = cfg.context
    assert start == min(first, soak)
    assert last - start == (cfg.turns - 1) * step
    assert last >= soak > last - step or (cfg.turns == 1 and last == start == soak)


@given(
    st.integers(min_value=400, max_value=599),
    st.one_of(
        st.binary(max_size=300),
        st.dictionaries(st.sampled_from(["error", "detail", "message", "x"]),
                        st.one_of(st.text(max_size=50), st.integers(),
                                  st.dictionaries(st.just("message"), st.text(max_size=50)))
                        ).map(lambda d: json.dumps(d).encode()),
    ),
)
def test_any_refusal_body_becomes_one_line_with_its_status(status: int, body: bytes) -> None:
    line = reason(httpx.Response(status, content=body))
    assert line.startswith(f"HTTP {status}: ")
    assert "\n" not in line
    assert "\r" not in line


def test_a_refusal_carries_the_servers_own_words() -> None:
    vllm = {"error": {"message": "chat template is missing", "type": "BadRequestError"}}
    assert reason(httpx.Response(400, json=vllm)) == "HTTP 400: chat template is missing"
    assert reason(httpx.Response(404, text="no\nsuch route")) == "HTTP 404: no such route"


# ---- the default warm-up (simulated engine: it counts every request it completes) --------


def _completed(url: str) -> int:
    with urllib.request.urlopen(f"{url}/sim/stats", timeout=5) as resp:
        return int(json.load(resp)["completed"])


def test_a_run_warms_up_by_default_reports_it_and_no_warmup_measures_from_cold(
    tmp_path: Path,
) -> None:
    with spawn(SimConfig(port=0, ttft=0.01, itl=0.001)) as url:
        out = tmp_path / "w.json"
        args = ("--url", url, "--prompt", "16", "--gen", "8", "--requests", "5", "--concurrency",
                "3", "--no-progress", "--json", str(out))  # fmt: skip
        before = _completed(url)
        result = run_cli(*args)
        assert result.returncode == 0, result.stderr
        data = json.loads(out.read_text())
        assert data["warmup"]["requests"] == 3  # one per stream
        assert data["warmup"]["ok"] == 3
        assert data["config"]["warmup"] is None  # the default, recorded as such
        assert "warm-up: 3 unmeasured requests" in result.stdout
        # the 1-token check before the run, the warm-up, the measured requests
        assert _completed(url) - before == 1 + 3 + 5

        before = _completed(url)
        result = run_cli(*args, "--no-warmup")
        assert result.returncode == 0, result.stderr
        assert json.loads(out.read_text())["warmup"] is None
        assert "warm-up: none" in result.stdout
        assert _completed(url) - before == 1 + 5

        result = run_cli(*args, "--warmup", "4")
        assert json.loads(out.read_text())["warmup"]["requests"] == 4
        result = run_cli(*args, "--warmup", "2", "--no-warmup")
        assert result.returncode == 2
        assert "not allowed with argument" in result.stderr


# ---- a 4xx from a control request, in the server's words --------------------------------


@pytest.fixture(scope="module")
def no_template(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model's tokenizer without its chat template (a base model's)."""
    folder = tmp_path_factory.mktemp("no-template")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(Path(tiny_model_path) / name, folder / name)
    return folder


def test_an_agent_run_against_a_model_without_chat_template_says_so_in_the_servers_words(
    no_template: Path,
) -> None:
    with spawn_standin("--tokenizer", str(no_template), "--tokenize") as url:
        result = run_cli("--url", url, "--workload", "agent", "--no-progress")
    assert result.returncode == 1
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "HTTP 400" in err
    assert "chat template" in err  # transformers' words, passed on as vLLM does
    assert "--chat-template" in err
    assert "Traceback" not in err
    # the server's reason, not a claim that it lacks the /tokenize it just answered
    assert err.startswith("loadgen: error: the server cannot render a chat prompt (HTTP 400: ")
    assert "no vLLM-style /tokenize" not in err


# ---- --tokenizer against a server that counts one more token ---------------------------


def test_a_tokenizer_count_mismatch_is_reported_and_the_figures_kept(
    tiny_model_path: str, tmp_path: Path
) -> None:
    out = tmp_path / "m.json"
    with spawn_standin("--tokenizer", tiny_model_path, "--extra-prompt-tokens", "1") as url:
        args = ("--url", url, "--prompt", "64", "--gen", "8", "--requests", "4", "--no-progress",
                "--tokenizer", tiny_model_path, "--json", str(out))  # fmt: skip
        result = run_cli(*args)
        assert result.returncode == 0, result.stderr
        data = json.loads(out.read_text())
        assert data["summary"]["requests_ok"] == 4
        assert data["summary"]["prompt_mismatch"] == {"requests": 4, "min_off": 1, "max_off": 1}
        assert {(r["prompt_tokens"], r["prompt_expected"]) for r in data["requests"]} == {(65, 64)}
        assert data["summary"]["ttft_s"]["p50"] > 0
        assert "4 of 4 prompts: the server counted +1 tokens against the tokenizer" in result.stdout

        strict = run_cli(*args, "--strict-counts")
    assert strict.returncode == 1
    assert "4 of 4 requests failed" in strict.stderr
    assert "token count mismatch: prompt 65 != 64" in strict.stderr


# ---- --depth against the stand-in's simulated prefix cache ------------------------------


@pytest.fixture(scope="module")
def caching(tiny_model_path: str) -> Iterator[str]:
    """One stand-in with the simulated prefix cache for the depth and soak tests below (each
    start loads the tokenizer, ~10 s of CPU here). The only test that reads cache figures runs
    first; its bounds hold whatever an earlier run left cached (the prime fills the context,
    and a cold request's context is its own)."""
    with spawn_standin("--tokenizer", tiny_model_path, "--cached-tokens", "--itl", "0.001") as url:
        yield url


def _depth_run(url: str, out: Path, *args: str) -> tuple[Any, dict[str, Any]]:
    result = run_cli(
        "--url", url, "--prompt", "32", "--gen", "4", "--requests", "3", "--no-progress",
        "--json", str(out), *args,
    )  # fmt: skip
    return result, json.loads(out.read_text()) if out.exists() else {}


def test_depth_requests_are_context_plus_new_tokens_with_the_context_cached_or_cold(
    caching: str, tiny_model_path: str, tmp_path: Path
) -> None:
    url = caching
    result, data = _depth_run(url, tmp_path / "d.json", "--tokenizer", tiny_model_path,
                              "--depth", "0,512,1K")
    assert result.returncode == 0, result.stderr
    runs = data["runs"]
    assert [r["depth"]["tokens"] for r in runs] == [0, 512, 1024]
    for run in runs:
        depth = run["depth"]["tokens"]
        assert {r["prompt_tokens"] for r in run["requests"]} == {depth + 32}  # exact
        assert run["depth"]["mode"] == "cached"
        cached = {r["cached_tokens"] for r in run["requests"]}
        # the stand-in caches whole 16-token blocks of what it has seen
        assert all(depth - 16 <= c <= depth + 32 for c in cached) if depth else True
        assert run["depth"]["prefill_new_tok_s"]["p50"] > 0
    assert runs[0]["depth"]["prime"] is None  # nothing to cache at depth 0
    assert runs[2]["depth"]["prime"]["prompt_tokens"] == 1024 + 32
    assert "depth 1024, concurrency 1: context primed by one unmeasured" in result.stdout
    assert "warm-up: 2 unmeasured requests before measuring each level" in result.stdout

    cold, data = _depth_run(url, tmp_path / "c.json", "--tokenizer", tiny_model_path,
                            "--depth", "1k", "--depth-cold")
    assert cold.returncode == 0, cold.stderr
    assert data["depth"]["prime"] is None
    assert {r["prompt_tokens"] for r in data["requests"]} == {1032}
    # a fresh context per request: at most the template's first block is shared
    assert max(r["cached_tokens"] for r in data["requests"]) <= 16

    too_deep = run_cli("--url", url, "--depth", "4k", "--tokenizer", tiny_model_path)
    assert too_deep.returncode == 1
    # one line in the user's terms: what was asked, the context, the deepest that fits
    assert too_deep.stderr.strip().splitlines() == [
        "loadgen: error: --depth 4000 + --prompt 512 + --gen 256 = 4768 tokens, past the"
        " 4096-token context of the served model: the deepest that fits is --depth 3328; lower"
        " --depth, or serve the model with a longer --max-model-len"]


def test_depth_runs_are_pushed_with_a_depth_label(
    caching: str, tiny_model_path: str, tmp_path: Path
) -> None:
    out, url = tmp_path / "d.json", caching
    with (
        pushgateway(tmp_path / "pgw") as pgw,
        prometheus(scrape_config({"pushgateway": [host_port(pgw)]}), tmp_path / "prom") as prom,
    ):
        result, data = _depth_run(url, out, "--tokenizer", tiny_model_path, "--depth", "0,1k",
                                  "--pushgateway", pgw, "--run-id", "depthtest")
        assert result.returncode == 0, result.stderr
        depths = {str(r["depth"]["tokens"]) for r in data["runs"]}

        def every_depth(rows: list[dict[str, Any]]) -> bool:  # a scrape between two pushes
            return {r["metric"]["depth"] for r in rows} == depths  # shows only the first

        rows = wait_for(prom, 'loadgen_ttft_seconds{run_id="depthtest",stat="p50"}', 30,
                        until=every_depth)
        by_depth = {r["metric"]["depth"]: float(r["value"][1]) for r in rows}
        assert by_depth == pytest.approx(
            {str(r["depth"]["tokens"]): r["summary"]["ttft_s"]["p50"] for r in data["runs"]}
        )
        assert {r["metric"]["depth_mode"] for r in rows} == {"cached"}
        cached = wait_for(prom, 'loadgen_depth_cached_tokens{run_id="depthtest",stat="p50"}', 10,
                          until=every_depth)
        assert {r["metric"]["depth"]: float(r["value"][1]) for r in cached} == pytest.approx(
            {str(r["depth"]["tokens"]): r["depth"]["cached_tokens"]["p50"] for r in data["runs"]}
        )


# ---- the agent soak -----------------------------------------------------------------------


def test_an_agent_soak_keeps_taking_turns_until_the_conversation_crosses_the_tokens_asked(
    caching: str, tiny_model_path: str, tmp_path: Path
) -> None:
    out, url = tmp_path / "s.json", caching
    with (
        pushgateway(tmp_path / "pgw") as pgw,
        prometheus(scrape_config({"pushgateway": [host_port(pgw)]}), tmp_path / "prom") as prom,
    ):
        result = run_cli(
            "--url", url, "--workload", "agent", "--sessions", "2", "--context", "300",
            "--soak-tokens", "1.5k", "--turn-tokens", "300", "--gen", "8", "--think", "0.02",
            "--tokenizer", tiny_model_path, "--pushgateway", pgw, "--run-id", "soaktest",
            "--json", str(out), "--no-progress",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        agent = json.loads(out.read_text())["agent"]
        assert (agent["turns"], agent["context"]) == (5, [300, 1500])
        assert agent["per_turn"][-1]["prompt_tokens"]["min"] >= 1450
        rows = wait_for(prom, 'loadgen_agent_ttft_seconds{run_id="soaktest",stat="p50"}', 30)
        assert sorted(int(r["metric"]["turn"]) for r in rows) == [1, 2, 3, 4, 5]
        depth = wait_for(prom, 'loadgen_agent_prompt_tokens{run_id="soaktest",stat="p50"}', 10)
        assert len(depth) == 5
    both = run_cli("--url", "http://127.0.0.1:9", "--workload", "agent", "--soak-tokens", "64k",
                   "--turns", "3")
    assert both.returncode == 2
    assert "drop --turns" in both.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--depth-cold",), "--depth-cold needs --depth D"),
        (("--depth", "8k", "--pptg"), "drop --pptg, --rate and --workload agent"),
        (("--depth", "8k", "--shared-prefix", "16"), "drop --shared-prefix"),
        (("--depth", "-5"), "a token count is a whole number"),
        (("--depth", "1.5K"), "did you mean 1.5k"),
        (("--soak-tokens", "64k"), "add --workload agent"),
        (("--workload", "agent", "--soak-tokens", "64k", "--turn-tokens", "0"), "--turn-tokens"),
        (("--warmup", "-1"), "--warmup cannot be negative"),
        (("--strict-counts",), "--strict-counts checks the server's counts against --tokenizer"),
    ],
)
def test_depth_soak_and_warmup_options_that_cannot_work_are_one_line_before_anything_is_sent(
    args: tuple[str, ...], says: str
) -> None:
    result = run_cli("--url", "http://127.0.0.1:9", *args)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
