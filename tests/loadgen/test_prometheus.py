"""The Prometheus path end to end: loadgen -> Pushgateway / metrics port -> Prometheus -> query.

Real Debian binaries on free loopback ports (tests/support/prom.py); values are read back
through Prometheus's HTTP API and compared with loadgen's own --json of the same run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.loadgen.conftest import REPO, TTFT, run_cli
from tests.support.prom import (
    free_port,
    host_port,
    prometheus,
    pushgateway,
    scrape_config,
    wait_for,
)

pytestmark = pytest.mark.prometheus


def _value(rows: list[dict[str, object]]) -> float:
    assert len(rows) == 1, rows
    return float(rows[0]["value"][1])  # type: ignore[index]


def test_a_test_pushgateway_starts_empty_whatever_an_earlier_one_held(tmp_path: Path) -> None:
    # Every test here compares what Prometheus returns with this run's --json; a group left by
    # an earlier Pushgateway (same job and run_id, another run's values) would be scraped first.
    marker = f"leftover_{tmp_path.name}"
    with pushgateway(tmp_path / "first") as pgw:
        put = httpx.put(f"{pgw}/metrics/job/loadgen/run_id/{marker}", content=f"{marker} 1\n")
        assert put.status_code == 200, put.text
        assert marker in httpx.get(f"{pgw}/metrics").text
    with pushgateway(tmp_path / "second") as pgw:
        assert marker not in httpx.get(f"{pgw}/metrics").text


def test_pushed_metrics_can_be_queried_from_prometheus(sim_url: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with (
        pushgateway(tmp_path / "pgw") as pgw,
        prometheus(scrape_config({"pushgateway": [host_port(pgw)]}), tmp_path / "prom") as prom,
    ):
        result = run_cli(
            "--url",
            sim_url,
            "--prompt",
            "512",
            "--gen",
            "32",
            "--concurrency",
            "2",
            "--requests",
            "4",
            "--pushgateway",
            pgw,
            "--run-id",
            "pushtest",
            "--label",
            "gpu=none",
            "--json",
            str(out),
        )
        assert result.returncode == 0, result.stderr
        summary = json.loads(out.read_text())["summary"]
        sel = '{run_id="pushtest",stat="p50"}'
        rows = wait_for(prom, f"loadgen_ttft_seconds{sel}", timeout=30)
        labels = rows[0]["metric"]
        assert labels["job"] == "loadgen"
        assert (labels["model"], labels["prompt"], labels["gen"], labels["concurrency"]) == (
            "sim-model",
            "512",
            "32",
            "2",
        )
        assert (labels["plan"], labels["gpu"]) == ("unknown", "none")
        assert _value(rows) == pytest.approx(summary["ttft_s"]["p50"])
        assert TTFT <= _value(rows) < TTFT + 0.1
        decode = wait_for(prom, f"loadgen_decode_tokens_per_second{sel}", timeout=10)
        assert _value(decode) == pytest.approx(summary["decode_tok_s"]["p50"])
        ok = wait_for(prom, 'loadgen_requests_total{run_id="pushtest",outcome="ok"}', timeout=10)
        assert _value(ok) == 4
        output = wait_for(prom, 'loadgen_output_tokens_per_second{run_id="pushtest"}', timeout=10)
        assert _value(output) == pytest.approx(summary["output_tok_s"])
        assert wait_for(prom, 'loadgen_run_timestamp_seconds{run_id="pushtest"}', timeout=10)


def test_a_sweep_pushes_one_series_per_concurrency(sim_url: str, tmp_path: Path) -> None:
    with (
        pushgateway(tmp_path / "pgw") as pgw,
        prometheus(scrape_config({"pushgateway": [host_port(pgw)]}), tmp_path / "prom") as prom,
    ):
        result = run_cli(
            "--url",
            sim_url,
            "--prompt",
            "64",
            "--gen",
            "8",
            "--sweep",
            "1,2,4",
            "--requests",
            "4",
            "--pushgateway",
            pgw,
            "--run-id",
            "sweeptest",
        )
        assert result.returncode == 0, result.stderr
        promql = 'loadgen_decode_tokens_per_second{run_id="sweeptest",stat="p50"}'
        rows = wait_for(prom, f"count({promql}) >= 3", timeout=30)
        assert _value(rows) == 3


def test_metrics_port_is_scraped_while_the_run_lasts(sim_url: str, tmp_path: Path) -> None:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "loadgen",
        "--url",
        sim_url,
        "--prompt",
        "64",
        "--gen",
        "64",
        "--concurrency",
        "4",
        "--duration",
        "4",
        "--metrics-port",
        str(port),
        "--metrics-linger",
        "3",
        "--run-id",
        "porttest",
    ]
    with prometheus(scrape_config({"loadgen": [f"127.0.0.1:{port}"]}), tmp_path / "prom") as prom:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            # Seen during the run, before the process ends.
            rows = wait_for(
                prom, 'loadgen_requests_total{run_id="porttest",outcome="ok"} > 0', timeout=15
            )
            assert proc.poll() is None
            assert rows[0]["metric"]["concurrency"] == "4"
            itl = wait_for(prom, 'loadgen_itl_seconds{run_id="porttest",stat="p50"}', timeout=10)
            assert _value(itl) == pytest.approx(0.012, abs=0.004)
        finally:
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err


def test_an_agent_run_pushes_one_series_per_turn_and_its_cache_hit_rate(
    tiny_model_path: str, tmp_path: Path
) -> None:
    from tests.loadgen.standin import spawn

    out = tmp_path / "a.json"
    with (
        spawn("--tokenizer", tiny_model_path, "--cached-tokens", "--itl", "0.001") as url,
        pushgateway(tmp_path / "pgw") as pgw,
        prometheus(scrape_config({"pushgateway": [host_port(pgw)]}), tmp_path / "prom") as prom,
    ):
        result = run_cli(
            "--url", url, "--workload", "agent", "--sessions", "2", "--turns", "3",
            "--context", "200:400", "--gen", "8", "--think", "0.05",
            "--pushgateway", pgw, "--run-id", "agenttest", "--json", str(out),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        agent = json.loads(out.read_text())["agent"]
        sel = '{run_id="agenttest",stat="p50"}'
        rows = wait_for(prom, f"loadgen_agent_ttft_seconds{sel}", timeout=30)
        by_turn = {r["metric"]["turn"]: float(r["value"][1]) for r in rows}
        assert by_turn == pytest.approx(
            {str(t["turn"]): t["ttft_s"]["p50"] for t in agent["per_turn"]}
        )
        assert {r["metric"]["concurrency"] for r in rows} == {"2"}  # the sessions
        hits = wait_for(prom, 'loadgen_agent_prefix_cache_hit_ratio{run_id="agenttest"}', 10)
        assert len(hits) == 3
        run = wait_for(prom, 'loadgen_prefix_cache_hit_ratio{run_id="agenttest"}', 10)
        assert _value(run) == pytest.approx(agent["prefix_cache"]["hit_rate"])
