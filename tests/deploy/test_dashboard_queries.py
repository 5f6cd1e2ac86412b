"""Every PromQL expression of the dashboard and of the recording rules, against a real Prometheus.

A real Prometheus (Debian package) scrapes the real stack (vLLM CPU + the proxy, from the `stack`
fixture) and a real Pushgateway that a real `loadgen` run pushed to, with the shipped
prometheus.yml and rules (only targets and intervals replaced). After that traffic, each query
must parse, and each one the CPU stack can feed must return at least one finite sample. Queries
that only GPUs can feed are listed below and are only checked to parse.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.deploy.feeds import (
    FAILURE_ONLY,
    GPU_ONLY_PANELS,
    GPU_ONLY_RULES,
    LAUNCHER_ONLY_PANELS,
    OFFLOAD_ONLY_PANELS,
)
from tests.deploy.shipped import (
    Query,
    dashboard_queries,
    load_dashboard,
    render_prometheus_config,
    rule_queries,
    substitute,
)
from tests.support.prom import (
    host_port,
    prometheus,
    pushgateway,
    query,
    targets_health,
    wait_for,
)

pytestmark = [pytest.mark.stack, pytest.mark.prometheus]

RATE_INTERVAL = "1m"  # what Grafana's $__rate_interval is at a 15 s scrape interval
SCRAPE_INTERVAL = "1s"


@dataclass(frozen=True)
class Observed:
    prom_url: str
    variables: dict[str, str]
    launcher_started: bool
    run_id: str  # the standard loadgen run ($run_id also matches the agent run beside it)


def run_loadgen(proxy_url: str, pgw_url: str, run_id: str) -> None:
    argv = [
        sys.executable, "-m", "loadgen", "--url", proxy_url, "--prompt", "48", "--gen", "12",
        "--concurrency", "2", "--requests", "6", "--pushgateway", pgw_url,
        "--run-id", run_id, "--label", "plan=deploy-test", "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"loadgen failed ({done.returncode}):\n{done.stderr[-3000:]}"


def run_loadgen_agent(proxy_url: str, vllm_url: str, pgw_url: str, run_id: str) -> None:
    """A short agent run through the proxy, whose /metrics has no vllm:prefix_cache_*: the
    engine's are read directly (the agent panels need both its per-turn and cache series)."""
    argv = [
        sys.executable, "-m", "loadgen", "--url", proxy_url, "--workload", "agent",
        "--sessions", "2", "--turns", "3", "--context", "200:400", "--gen", "8",
        "--think", "0.2", "--metrics-url", f"{vllm_url}/metrics", "--pushgateway", pgw_url,
        "--run-id", run_id, "--label", "plan=deploy-test", "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"agent loadgen failed:\n{done.stderr[-3000:]}"


def run_loadgen_depth(vllm_url: str, pgw_url: str, run_id: str) -> None:
    """A short depth sweep straight at the engine (its usage reports cached tokens)."""
    argv = [
        sys.executable, "-m", "loadgen", "--url", vllm_url, "--prompt", "32", "--gen", "4",
        "--requests", "2", "--depth", "0,512", "--pushgateway", pgw_url, "--run-id", run_id,
        "--label", "plan=deploy-test", "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"depth loadgen failed:\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def observed(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    work = tmp_path_factory.mktemp("prom")
    with pushgateway(work / "pgw") as pgw_url:
        config = render_prometheus_config(
            {
                "toposerve-proxy": host_port(stack.proxy_url),
                "vllm": host_port(stack.vllm_url),
                "pushgateway": host_port(pgw_url),
            },
            interval=SCRAPE_INTERVAL,
        )
        with prometheus(config, work / "prometheus") as prom_url:
            wait_for(prom_url, "count(up == 1) == 3", timeout=30)
            run_id = f"deploy-test-{uuid.uuid4().hex[:8]}"
            # A first run creates the proxy's labelled series; the measured one then moves every
            # counter and histogram between two scrapes, inside the 1m rate windows.
            run_loadgen(stack.proxy_url, pgw_url, run_id + "-warmup")
            time.sleep(3)
            run_loadgen(stack.proxy_url, pgw_url, run_id)
            run_loadgen_agent(stack.proxy_url, stack.vllm_url, pgw_url, run_id + "-agent")
            run_loadgen_depth(stack.vllm_url, pgw_url, run_id + "-depth")
            wait_for(prom_url, f'loadgen_run_timestamp_seconds{{run_id="{run_id}"}}', 30)
            wait_for(prom_url, f'loadgen_agent_ttft_seconds{{run_id="{run_id}-agent"}}', 30)
            wait_for(prom_url, f'loadgen_depth_cached_tokens{{run_id="{run_id}-depth"}}', 30)
            wait_for(prom_url, "model:toposerve_generation_tokens:rate1m > 0", 30)
            wait_for(prom_url, "model_name:vllm_generation_tokens:rate1m > 0", 30)
            runs = f"{run_id}|{run_id}-agent|{run_id}-depth"  # Grafana's three selected runs
            variables = {"__rate_interval": RATE_INTERVAL, "model": stack.model, "run_id": runs}
            yield Observed(prom_url, variables, stack.launcher_pid is not None, run_id)


def finite_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if math.isfinite(float(r["value"][1]))]


def check(observed: Observed, q: Query, *, fed: bool) -> str | None:
    """None when the query is fine, else what is wrong with it (collected, then reported)."""
    expr = substitute(q.expr, observed.variables)
    try:
        rows = query(observed.prom_url, expr)
    except Exception as exc:  # QueryError and HTTP errors alike: report them all at once
        return f"{q}\n    does not evaluate: {exc}"
    if fed and not finite_rows(rows):
        return f"{q}\n    returned no finite sample (got {rows[:3]})"
    return None


def known_metadata(prom_url: str) -> set[str]:
    body = httpx.get(f"{prom_url}/api/v1/metadata", timeout=10).json()
    return set(body["data"])


def test_all_shipped_scrape_jobs_are_up(observed: Observed) -> None:
    health = targets_health(observed.prom_url)
    assert len(health) == 3
    assert all(state == "up" for state in health.values()), health


def test_every_dashboard_query_parses_and_the_cpu_stack_feeds_it(observed: Observed) -> None:
    skipped = set(GPU_ONLY_PANELS) | OFFLOAD_ONLY_PANELS
    if not observed.launcher_started:
        skipped |= LAUNCHER_ONLY_PANELS
    problems = [
        check(observed, q, fed=q.where not in skipped and (q.where, q.ref) not in FAILURE_ONLY)
        for q in dashboard_queries(load_dashboard())
    ]
    wrong = [p for p in problems if p]
    assert not wrong, f"{len(wrong)} of {len(problems)} dashboard queries:\n" + "\n".join(wrong)


def test_every_recording_rule_parses_and_the_cpu_stack_feeds_it(observed: Observed) -> None:
    problems = [check(observed, q, fed=q.ref not in GPU_ONLY_RULES) for q in rule_queries()]
    # The recorded series themselves, as Prometheus stored them from its own evaluations.
    problems += [
        check(observed, Query(q.where, "recorded", q.ref), fed=q.ref not in GPU_ONLY_RULES)
        for q in rule_queries()
    ]
    wrong = [p for p in problems if p]
    assert not wrong, f"{len(wrong)} of {len(problems)} rule queries:\n" + "\n".join(wrong)


def test_failure_only_series_are_declared_by_the_proxy(observed: Observed) -> None:
    queries = {(q.where, q.ref): q for q in dashboard_queries(load_dashboard())}
    known = known_metadata(observed.prom_url)
    for key in FAILURE_ONLY:
        for metric in queries[key].metrics:
            # OpenMetrics (what Prometheus asks for) names a counter's family without _total.
            names = {metric, metric.removesuffix("_total")}
            assert names & known, f"{metric} ({key}) is not declared by any scraped target"


def test_dashboard_variables_offer_the_served_model_and_the_run(observed: Observed) -> None:
    models = {
        r["metric"]["model_name"]
        for r in query(observed.prom_url, "group by (model_name) (vllm:num_requests_running)")
    }
    proxy_models = {
        r["metric"]["model"]
        for r in query(observed.prom_url, "group by (model) (toposerve_requests_total)")
    }
    runs = {
        r["metric"]["run_id"]
        for r in query(observed.prom_url, "group by (run_id) (loadgen_run_timestamp_seconds)")
    }
    assert observed.variables["model"] in models
    # One $model variable filters both vLLM's model_name and the proxy's model label.
    assert observed.variables["model"] in proxy_models
    assert {observed.run_id, observed.run_id + "-agent"} <= runs


def test_loadgen_run_reaches_prometheus_with_its_labels(observed: Observed) -> None:
    run_id = observed.run_id
    rows = query(observed.prom_url, f'loadgen_requests_total{{run_id="{run_id}",outcome="ok"}}')
    assert len(rows) == 1
    labels = rows[0]["metric"]
    assert labels["job"] == "loadgen"  # honor_labels kept the pushed job
    assert labels["plan"] == "deploy-test"
    assert labels["model"] == observed.variables["model"]
    assert float(rows[0]["value"][1]) == 6


def test_an_agent_run_reaches_prometheus_per_turn(observed: Observed) -> None:
    run_id = observed.run_id + "-agent"
    rows = query(observed.prom_url, f'loadgen_agent_ttft_seconds{{run_id="{run_id}",stat="p50"}}')
    assert sorted(r["metric"]["turn"] for r in rows) == ["1", "2", "3"]
    hit = query(observed.prom_url, f'loadgen_prefix_cache_hit_ratio{{run_id="{run_id}"}}')
    assert len(hit) == 1
    assert 0 < float(hit[0]["value"][1]) <= 1  # later turns resend the earlier ones
