"""The dashboard JSON Grafana loads: generated from build_dashboard.py, well-formed, complete.

Its queries are evaluated against a real Prometheus fed by the real stack in
test_dashboard_queries.py; here every query is at least parsed by a real Prometheus with nothing
to scrape, so a syntax error shows even when the stack tests are deselected.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.feeds import (
    FAILURE_ONLY,
    GPU_ONLY_PANELS,
    GPU_ONLY_RULES,
    LAUNCHER_ONLY_PANELS,
    OFFLOAD_METRIC_PREFIXES,
    OFFLOAD_ONLY_PANELS,
)
from tests.deploy.shipped import (
    DEPLOY,
    Query,
    all_panels,
    dashboard_queries,
    load_dashboard,
    render_prometheus_config,
    rule_queries,
    substitute,
)
from tests.support.prom import QueryError, prometheus, query, scrape_config

BUILDER = DEPLOY / "grafana" / "build_dashboard.py"
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range"}
PANEL_TYPES = {"row", "timeseries", "table", "stat", "barchart"}

# What issue 6 asks the dashboard to show, as the metric each panel must read.
REQUIRED_METRICS = [
    ("prefill tok/s, vLLM", "vllm:prompt_tokens_total"),
    ("decode tok/s, vLLM", "vllm:generation_tokens_total"),
    ("prefill tok/s, loadgen", "loadgen_prefill_tokens_per_second"),
    ("decode tok/s, loadgen", "loadgen_decode_tokens_per_second"),
    ("TTFT, proxy histogram", "toposerve_ttft_seconds_bucket"),
    ("TTFT, vLLM histogram", "vllm:time_to_first_token_seconds_bucket"),
    ("ITL, proxy histogram", "toposerve_itl_seconds_bucket"),
    ("ITL, vLLM histogram", "vllm:inter_token_latency_seconds_bucket"),
    ("running requests", "vllm:num_requests_running"),
    ("waiting requests", "vllm:num_requests_waiting"),
    ("KV-cache use", "vllm:kv_cache_usage_perc"),
    ("prefix-cache hit rate through the proxy", "toposerve_engine_prefix_cache_hits_total"),
    ("GPU utilisation", "toposerve_gpu_utilization_ratio"),
    ("GPU power", "toposerve_gpu_power_watts"),
    ("PCIe tx", "toposerve_gpu_pcie_tx_bytes_per_second"),
    ("PCIe rx", "toposerve_gpu_pcie_rx_bytes_per_second"),
    ("NVLink tx", "toposerve_gpu_nvlink_tx_bytes_total"),
    ("NVLink rx", "toposerve_gpu_nvlink_rx_bytes_total"),
    ("plan in force and NCCL transport", "toposerve_plan_info"),
    ("loadgen runs compared", "loadgen_ttft_seconds"),
    # issue 24: what keeps an agent's prefix warm, and what it costs at depth
    ("vLLM's own prefix-cache hit rate", "vllm:prefix_cache_hits_total"),
    ("KV offloading: GPU to host", "vllm:kv_offload_store_bytes_total"),
    ("KV offloading: host to GPU", "vllm:kv_offload_load_bytes_total"),
    ("KV offloading: hits from host memory", "vllm:external_prefix_cache_hits_total"),
    ("prefill of the new tokens at depth", "loadgen_depth_prefill_new_tokens_per_second"),
    ("cached tokens at depth", "loadgen_depth_cached_tokens"),
    ("TTFT per agent turn", "loadgen_agent_ttft_seconds"),
    ("an agent turn's context", "loadgen_agent_prompt_tokens"),
]


def test_committed_dashboard_is_what_the_builder_generates() -> None:
    done = subprocess.run(
        [sys.executable, str(BUILDER), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("what", "metric"), REQUIRED_METRICS)
def test_dashboard_shows(what: str, metric: str) -> None:
    used = set().union(*(q.metrics for q in dashboard_queries(load_dashboard())))
    assert metric in used, f"no panel shows {what} ({metric})"


def test_ttft_by_depth_reads_loadgens_depth_label() -> None:
    exprs = [q.expr for q in dashboard_queries(load_dashboard()) if q.where == "TTFT by depth"]
    assert exprs
    assert all('depth!=""' in e and "by (depth)" in e for e in exprs)


def test_offload_only_list_names_exactly_the_offload_fed_panels() -> None:
    queries = dashboard_queries(load_dashboard())
    fed = {
        q.where for q in queries if any(m.startswith(OFFLOAD_METRIC_PREFIXES) for m in q.metrics)
    }
    assert fed == OFFLOAD_ONLY_PANELS


def test_plan_panel_shows_the_nccl_transport() -> None:
    exprs = [q.expr for q in dashboard_queries(load_dashboard()) if "toposerve_plan_info" in q.expr]
    assert any("transport" in e for e in exprs)


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = list(all_panels(load_dashboard()))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0, p["title"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_every_panel_queries_the_dashboard_datasource() -> None:
    for p in all_panels(load_dashboard()):
        assert p["type"] in PANEL_TYPES, p["type"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], f"{p['title']} has no query"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        assert all(t["expr"].strip() for t in p["targets"]), p["title"]


def test_every_variable_a_query_uses_is_defined() -> None:
    dashboard = load_dashboard()
    defined = {v["name"] for v in dashboard["templating"]["list"]} | GRAFANA_BUILTINS
    values = {name: "x" for name in defined}
    for q in dashboard_queries(dashboard):
        substitute(q.expr, values)  # KeyError names an undefined variable


def test_titles_are_unique_so_the_gpu_and_failure_lists_are_unambiguous() -> None:
    titles = [p["title"] for p in all_panels(load_dashboard()) if p["type"] != "row"]
    assert len(titles) == len(set(titles))


def test_gpu_only_lists_name_exactly_the_gpu_fed_queries() -> None:
    queries = dashboard_queries(load_dashboard())
    gpu_fed = {q.where for q in queries if any(m.startswith("toposerve_gpu_") for m in q.metrics)}
    assert gpu_fed == GPU_ONLY_PANELS
    gpu_rules = {q.ref for q in rule_queries() if any("toposerve_gpu_" in m for m in q.metrics)}
    assert gpu_rules == GPU_ONLY_RULES
    titles = {q.where for q in queries}
    assert titles >= LAUNCHER_ONLY_PANELS
    assert {(q.where, q.ref) for q in queries} >= FAILURE_ONLY


@pytest.mark.prometheus
def test_every_query_parses_in_a_real_prometheus(tmp_path: Path) -> None:
    values = {"__rate_interval": "1m", "model": "m", "run_id": "r"}
    queries: list[Query] = [*dashboard_queries(load_dashboard()), *rule_queries()]
    wrong = []
    with prometheus(scrape_config({}), tmp_path) as url:
        for q in queries:
            try:
                query(url, substitute(q.expr, values))
            except QueryError as exc:
                wrong.append(f"{q}\n    {exc}")
    assert not wrong, "\n".join(wrong)


def test_shipped_config_rendering_refuses_a_renamed_job() -> None:
    with pytest.raises(ValueError, match="differ"):
        render_prometheus_config({"proxy": "127.0.0.1:1"}, interval="1s")
