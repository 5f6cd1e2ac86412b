"""Bad input and failing servers: one clear line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simengine.engine import SimConfig, spawn
from simengine.faults import parse_fault
from tests.loadgen.conftest import run_cli


def _one_line_error(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("loadgen: error: ")
    return lines[0]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--prompt", "0"], 2, "--prompt must be at least 1 token"),
        (["--prompt", "abc"], 2, "argument --prompt: invalid int value: 'abc'"),
        (["--requests", "2", "--duration", "1"], 2, "not allowed with argument"),
        (["--gen", "-3"], 2, "--gen must be at least 1 token"),
        (["--concurrency", "0"], 2, "--concurrency must be at least 1"),
        (["--label", "model=x"], 2, "--label model=..."),
        (["--model", "nope"], 1, "does not serve model 'nope'; it serves sim-model"),
        (["--plot", "x.png"], 2, "--plot draws a sweep"),
        (["--metrics-port", "70000"], 2, "--metrics-port must lie between 0 and 65535"),
        (["--duration", "inf"], 2, "--duration must be a finite number of seconds"),
        (["--rate", "inf"], 2, "--rate must be a finite number above 0"),
        (["--timeout", "nan"], 2, "--timeout must be a finite number above 0"),
        # output paths are checked before the run, not after a sweep of many minutes
        (["--json", "/nonexistent/dir/r.json"], 2, "folder /nonexistent/dir does not exist"),
        (["--csv", "/"], 2, "--csv / is a folder"),
    ],
)
def test_bad_arguments_exit_with_one_clear_line(
    sim_url: str, args: list[str], code: int, message: str
) -> None:
    result = run_cli("--url", sim_url, *args)
    assert result.returncode == code
    assert message in _one_line_error(result.stderr)


def test_unreachable_url_says_how_to_fix_it() -> None:
    result = run_cli("--url", f"http://127.0.0.1:{_closed_port()}", "--requests", "1")
    assert result.returncode == 1
    line = _one_line_error(result.stderr)
    assert "cannot reach" in line
    assert "--url" in line


def test_context_shorter_than_prompt_plus_gen_is_refused_before_sending() -> None:
    with spawn(SimConfig(port=0, max_model_len=600)) as url:
        result = run_cli("--url", url, "--prompt", "512", "--gen", "256")
    assert result.returncode == 1
    assert "context of 600 tokens, shorter than --prompt 512 + --gen 256 = 768" in _one_line_error(
        result.stderr
    )


def test_a_server_answering_errors_fails_the_run_with_the_reason(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with spawn(SimConfig(port=0, ttft=0.01, itl=0.001, fault=parse_fault("status=503"))) as url:
        result = run_cli(
            "--url", url, "--prompt", "8", "--gen", "4", "--requests", "4", "--json", str(out)
        )
    assert result.returncode == 1
    line = _one_line_error(result.stderr)
    assert "4 of 4 requests failed" in line
    assert "HTTP 503" in line
    assert json.loads(out.read_text())["summary"]["requests_failed"] == 4


def test_a_stream_cut_mid_way_is_a_failure_not_a_short_sample() -> None:
    with spawn(SimConfig(port=0, ttft=0.01, itl=0.001, fault=parse_fault("kill-after=5"))) as url:
        result = run_cli("--url", url, "--prompt", "8", "--gen", "16", "--requests", "2")
    assert result.returncode == 1
    assert "2 of 2 requests failed" in _one_line_error(result.stderr)


def _post(url: str, body: dict[str, object]) -> None:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(request, timeout=5).close()


def _completed(url: str) -> int:
    with urllib.request.urlopen(f"{url}/sim/stats", timeout=5) as resp:
        return int(json.load(resp)["completed"])


def test_a_run_with_some_failures_says_how_many_and_why(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with spawn(SimConfig(port=0, ttft=0.05, itl=0.01)) as url:

        def break_after_two() -> None:
            deadline = time.monotonic() + 30
            while _completed(url) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            _post(f"{url}/sim/control", {"fault": "status=500"})

        breaker = threading.Thread(target=break_after_two)
        breaker.start()
        result = run_cli(
            "--url", url, "--prompt", "8", "--gen", "16", "--requests", "8", "--json", str(out),
            "--no-warmup",  # the breaker counts the engine's requests: only measured ones
        )
        breaker.join()
    assert result.returncode == 1
    s = json.loads(out.read_text())["summary"]
    assert s["requests_ok"] >= 2
    assert s["requests_failed"] >= 1
    assert s["requests_ok"] + s["requests_failed"] == 8
    failed = s["requests_failed"]
    assert f"{failed} of 8 requests failed: {failed}× HTTP 500" in result.stdout
    assert f"{failed} of 8 requests failed" in _one_line_error(result.stderr)


def test_an_unreachable_pushgateway_fails_after_the_results_are_written(
    sim_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    result = run_cli(
        "--url",
        sim_url,
        "--prompt",
        "8",
        "--gen",
        "4",
        "--requests",
        "2",
        "--pushgateway",
        f"http://127.0.0.1:{_closed_port()}",
        "--json",
        str(out),
    )
    assert result.returncode == 1
    assert "cannot push to the Pushgateway" in _one_line_error(result.stderr)
    assert json.loads(out.read_text())["summary"]["requests_ok"] == 2
    assert "TTFT ms" in result.stdout


def test_an_unwritable_json_path_is_one_line_before_any_request(sim_url: str) -> None:
    before = httpx.get(sim_url + "/sim/stats").json()["generations"]
    result = run_cli(
        "--url",
        sim_url,
        "--prompt",
        "8",
        "--gen",
        "4",
        "--requests",
        "1",
        "--json",
        "/nonexistent-dir/r.json",
    )
    assert result.returncode == 2
    assert "--json /nonexistent-dir/r.json: folder /nonexistent-dir does not exist" in \
        _one_line_error(result.stderr)
    # refused before the run, not after it: the server was never asked to generate
    assert httpx.get(sim_url + "/sim/stats").json()["generations"] == before


@settings(max_examples=300, deadline=None)
@given(rest=st.text(max_size=30), scheme=st.sampled_from(["http://", "https://", ""]))
def test_any_url_is_refused_in_one_line_or_read_by_both_clients(scheme: str, rest: str) -> None:
    # `http://[::1` raised httpx.InvalidURL from the first request: a traceback.
    from loadgen.config import Config, validate
    from loadgen.errors import BadArgument
    from loadgen.transport import Endpoint

    url = scheme + rest
    for config in (Config(url=url), Config(metrics_url=url)):
        refusal = None
        try:
            validate(config)
        except BadArgument as exc:
            refusal = str(exc)
        if refusal is not None:
            assert "\n" not in refusal
            continue
        httpx.URL(config.metrics_url or config.url)  # neither raises for an accepted URL
        Endpoint.parse(config.url)


def test_a_url_written_as_an_openai_base_url_measures_the_same_server(sim_url: str) -> None:
    # OPENAI_BASE_URL-style .../v1: once meant /v1/v1/models and a 404
    result = run_cli("--url", sim_url + "/v1/", "--prompt", "8", "--gen", "4", "--requests", "2",
                     "--no-progress")
    assert result.returncode == 0, result.stderr
