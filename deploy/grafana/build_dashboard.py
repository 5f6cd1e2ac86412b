"""Generate deploy/grafana/dashboards/toposerve.json, the dashboard Grafana provisions.

    python deploy/grafana/build_dashboard.py           # rewrite the JSON
    python deploy/grafana/build_dashboard.py --check   # exit 1 if the committed JSON is stale

The committed JSON is what Grafana loads; CI checks that it equals this script's output and
evaluates every query in it against a real Prometheus. Panels are plain dicts in Grafana's
dashboard JSON model (schemaVersion 39, Grafana 10/11) so that no SDK is needed to read them.

Grafana variables used in queries: $model (vLLM's model_name, the proxy's model), $run_id
(loadgen runs) and $__rate_interval.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).parent / "dashboards" / "toposerve.json"
UID = "toposerve"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"))
RATE = "$__rate_interval"
WIDTH = 24

Panel = dict[str, Any]
Target = dict[str, Any]


def target(expr: str, legend: str = "", *, instant: bool = False, table: bool = False) -> Target:
    """One query; refIds are assigned by the panel in order."""
    out: Target = {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend or "__auto"}
    if instant:
        out |= {"instant": True, "range": False}
    if table:
        out["format"] = "table"
    return out


def quantile_targets(bucket: str, selector: str, prefix: str = "") -> list[Target]:
    return [
        target(
            f"histogram_quantile({q}, sum by (le) (rate({bucket}{{{selector}}}[{RATE}])))",
            f"{prefix}{name}",
        )
        for q, name in QUANTILES
    ]


def panel(
    kind: str,
    title: str,
    targets: Sequence[Target],
    *,
    w: int,
    h: int = 8,
    unit: str = "short",
    description: str = "",
    **extra: Any,
) -> Panel:
    """A panel without position: layout() gives ids and gridPos."""
    refs = [dict(t, refId=ref_id(i)) for i, t in enumerate(targets)]
    out: Panel = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": refs,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
        "gridPos": {"w": w, "h": h},
    }
    out.update(extra)
    return out


def ref_id(i: int) -> str:
    """The refId of a panel's i-th query; an instant table query's value column is
    ``Value #<refId>``."""
    return chr(ord("A") + i)


def merged_columns(rename: dict[str, str]) -> list[dict[str, Any]]:
    """Transformations that join instant table queries into one row per label set, drop the
    time column and name the value columns."""
    return [
        {"id": "merge", "options": {}},
        {
            "id": "organize",
            "options": {"excludeByName": {"Time": True}, "renameByName": rename},
        },
    ]


def bars_by(
    label: str,
    title: str,
    series: Sequence[tuple[str, str, str]],
    *,
    w: int,
    unit: str,
    orientation: str,
    description: str = "",
) -> Panel:
    """A bar chart of instant queries, one group of bars per value of ``label``; ``series`` is
    (query, legend, column name) per bar."""
    return panel(
        "barchart",
        title,
        [target(expr, legend, instant=True, table=True) for expr, legend, _ in series],
        w=w,
        h=9,
        unit=unit,
        transformations=merged_columns(
            {f"Value #{ref_id(i)}": column for i, (_, _, column) in enumerate(series)}
        ),
        options={
            "xField": label,
            "orientation": orientation,
            "showValue": "auto",
            "legend": {"displayMode": "list", "placement": "bottom"},
        },
        description=description,
    )


def timeseries(
    title: str,
    targets: Sequence[Target],
    *,
    w: int = 12,
    unit: str = "short",
    description: str = "",
) -> Panel:
    return panel(
        "timeseries",
        title,
        targets,
        w=w,
        unit=unit,
        description=description,
        options={
            "legend": {
                "displayMode": "table",
                "placement": "bottom",
                "calcs": ["lastNotNull", "max"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    )


def row(title: str) -> Panel:
    return {
        "type": "row",
        "title": title,
        "collapsed": False,
        "panels": [],
        "gridPos": {"w": WIDTH, "h": 1},
    }


def tokens_row() -> list[Panel]:
    vllm_sel = 'model_name=~"$model"'
    proxy_sel = 'model=~"$model"'
    run_sel = 'run_id=~"$run_id"'
    return [
        row("Prefill vs decode"),
        timeseries(
            "Prefill vs decode tok/s (vLLM)",
            [
                target(
                    f"sum by (model_name) (rate(vllm:prompt_tokens_total{{{vllm_sel}}}[{RATE}]))",
                    "prefill {{model_name}}",
                ),
                target(
                    "sum by (model_name) "
                    f"(rate(vllm:generation_tokens_total{{{vllm_sel}}}[{RATE}]))",
                    "decode {{model_name}}",
                ),
            ],
            unit="tps",
            description="Tokens vLLM prefilled (prompt) and generated per second.",
        ),
        timeseries(
            "Prefill vs decode tok/s (proxy, 1m recording rules)",
            [
                target(f"model:toposerve_prompt_tokens:rate1m{{{proxy_sel}}}", "prompt {{model}}"),
                target(
                    f"model:toposerve_generation_tokens:rate1m{{{proxy_sel}}}",
                    "generated {{model}}",
                ),
            ],
            unit="tps",
            description="Usage the proxy returned to clients (finished requests).",
        ),
        timeseries(
            "Prefill vs decode tok/s per request (loadgen runs)",
            [
                target(
                    f'loadgen_prefill_tokens_per_second{{stat="p50",{run_sel}}}',
                    "prefill p50 {{run_id}}",
                ),
                target(
                    f'loadgen_decode_tokens_per_second{{stat="p50",{run_sel}}}',
                    "decode p50 {{run_id}}",
                ),
            ],
            w=24,
            unit="tps",
            description="Client-side: prompt tokens / TTFT and (completion tokens - 1) / decode "
            "time of each request, medians per run.",
        ),
    ]


def latency_row() -> list[Panel]:
    proxy_sel = 'model=~"$model"'
    vllm_sel = 'model_name=~"$model"'
    return [
        row("Latency"),
        timeseries(
            "TTFT percentiles (proxy)",
            quantile_targets("toposerve_ttft_seconds_bucket", proxy_sel),
            unit="s",
        ),
        timeseries(
            "TTFT percentiles (vLLM)",
            quantile_targets("vllm:time_to_first_token_seconds_bucket", vllm_sel),
            unit="s",
        ),
        timeseries(
            "Inter-token latency percentiles (proxy)",
            quantile_targets("toposerve_itl_seconds_bucket", proxy_sel),
            unit="s",
        ),
        timeseries(
            "Inter-token latency percentiles (vLLM)",
            quantile_targets("vllm:inter_token_latency_seconds_bucket", vllm_sel),
            unit="s",
        ),
        timeseries(
            "End-to-end latency percentiles",
            [
                *quantile_targets("toposerve_e2e_seconds_bucket", proxy_sel, "proxy "),
                *quantile_targets("vllm:e2e_request_latency_seconds_bucket", vllm_sel, "vLLM "),
            ],
            unit="s",
        ),
        timeseries(
            "Time in vLLM's queue vs prefill",
            [
                *quantile_targets("vllm:request_queue_time_seconds_bucket", vllm_sel, "queue ")[
                    ::2
                ],
                *quantile_targets("vllm:request_prefill_time_seconds_bucket", vllm_sel, "prefill ")[
                    ::2
                ],
            ],
            unit="s",
            description="p50 and p99 of the time requests wait for a slot and spend in prefill.",
        ),
    ]


def load_row() -> list[Panel]:
    vllm_sel = 'model_name=~"$model"'
    proxy_sel = 'model=~"$model"'
    return [
        row("Requests and KV cache"),
        timeseries(
            "Running / waiting requests",
            [
                target(
                    f"sum by (model_name) (vllm:num_requests_running{{{vllm_sel}}})",
                    "vLLM running {{model_name}}",
                ),
                target(
                    f"sum by (model_name) (vllm:num_requests_waiting{{{vllm_sel}}})",
                    "vLLM waiting {{model_name}}",
                ),
                target(
                    f"sum by (model) (toposerve_requests_in_flight{{{proxy_sel}}})",
                    "proxy in flight {{model}}",
                ),
                target("sum(toposerve_requests_queued)", "proxy queued"),
            ],
        ),
        timeseries(
            "KV-cache use",
            [
                target(f"vllm:kv_cache_usage_perc{{{vllm_sel}}}", "{{model_name}} {{engine}}"),
                target(
                    # clamp_min: an idle engine reads 0, not 0/0
                    f"rate(toposerve_engine_prefix_cache_hits_total[{RATE}]) / clamp_min("
                    f"rate(toposerve_engine_prefix_cache_queries_total[{RATE}]), 1e-9)",
                    "prefix-cache hit rate {{upstream}}",
                ),
            ],
            unit="percentunit",
            description="Fraction of vLLM's KV-cache blocks in use (1 = full), and the share "
            "of prompt tokens served from the prefix cache (the engines' counters, re-exported "
            "by the proxy).",
        ),
        timeseries(
            "Requests/s by status (proxy)",
            [
                target(
                    "sum by (route, status) "
                    f"(rate(toposerve_requests_total{{{proxy_sel}}}[{RATE}]))",
                    "{{route}} {{status}}",
                ),
            ],
            unit="reqps",
        ),
        timeseries(
            "Upstream health",
            [
                target("toposerve_upstream_up", "up {{upstream}}"),
                target(
                    f"sum by (upstream, kind) (rate(toposerve_upstream_errors_total[{RATE}]))",
                    "errors/s {{upstream}} {{kind}}",
                ),
            ],
            description="1 = the proxy reaches vLLM; errors by kind (connect, timeout, "
            "status_5xx, stream_broken, malformed).",
        ),
    ]


def gpu_row() -> list[Panel]:
    by_gpu = "gpu {{gpu}} {{name}}"
    return [
        row("GPUs (NVML, read by the proxy at scrape time)"),
        timeseries(
            "GPU utilisation",
            [
                target("toposerve_gpu_utilization_ratio", by_gpu),
            ],
            unit="percentunit",
        ),
        timeseries("GPU power", [target("toposerve_gpu_power_watts", by_gpu)], unit="watt"),
        timeseries(
            "GPU memory used",
            [
                target(
                    "toposerve_gpu_memory_used_bytes / toposerve_gpu_memory_total_bytes", by_gpu
                ),
            ],
            unit="percentunit",
        ),
        timeseries(
            "PCIe throughput (rx negative)",
            [
                target("toposerve_gpu_pcie_tx_bytes_per_second", "tx " + by_gpu),
                target("-toposerve_gpu_pcie_rx_bytes_per_second", "rx " + by_gpu),
            ],
            unit="Bps",
        ),
        timeseries(
            "NVLink throughput (rx negative)",
            [
                target(f"rate(toposerve_gpu_nvlink_tx_bytes_total[{RATE}])", "tx " + by_gpu),
                target(f"-rate(toposerve_gpu_nvlink_rx_bytes_total[{RATE}])", "rx " + by_gpu),
            ],
            w=24,
            unit="Bps",
            description="All NVLink links of each GPU summed; flat at zero means TP traffic goes "
            "over PCIe.",
        ),
    ]


def plan_row() -> list[Panel]:
    plan_columns = ["mode", "tp", "pp", "dp", "transport", "engine", "model", "gpus"]
    return [
        row("Plan in force"),
        panel(
            "table",
            "Plan in force",
            [
                target(
                    "max by (mode, tp, pp, dp, transport, engine, model, gpus) "
                    "(toposerve_plan_info)",
                    instant=True,
                    table=True,
                ),
            ],
            w=16,
            h=5,
            transformations=[
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True, "Value": True},
                        "indexByName": {name: i for i, name in enumerate(plan_columns)},
                    },
                }
            ],
            description="From `launcher plan`: the split chosen and why is in the launcher log.",
        ),
        panel(
            "stat",
            "NCCL transport",
            [
                target("max by (transport) (toposerve_plan_info)", "{{transport}}", instant=True),
            ],
            w=8,
            h=5,
            options={
                "textMode": "name",
                "colorMode": "none",
                "graphMode": "none",
                "reduceOptions": {"calcs": ["lastNotNull"], "values": False},
            },
            description="How tensor/pipeline traffic moves between GPUs (NVLink, PCIe P2P, "
            "host memory, network).",
        ),
    ]


def runs_row() -> list[Panel]:
    sel = 'run_id=~"$run_id"'
    keys = "run_id, plan, prompt, gen, concurrency"

    def col(metric: str, stat: str | None = None) -> Target:
        matcher = f'{{stat="{stat}",{sel}}}' if stat else f"{{{sel}}}"
        return target(f"max by ({keys}) ({metric}{matcher})", instant=True, table=True)

    columns = [
        ("loadgen_prefill_tokens_per_second", "p50", "prefill tok/s p50"),
        ("loadgen_decode_tokens_per_second", "p50", "decode tok/s p50"),
        ("loadgen_output_tokens_per_second", None, "output tok/s"),
        ("loadgen_ttft_seconds", "p50", "TTFT p50"),
        ("loadgen_ttft_seconds", "p99", "TTFT p99"),
        ("loadgen_itl_seconds", "p50", "ITL p50"),
        ("loadgen_itl_seconds", "p99", "ITL p99"),
    ]
    targets = [col(metric, stat) for metric, stat, _ in columns]
    targets.append(
        target(
            f'max by ({keys}) (loadgen_requests_total{{outcome="failed",{sel}}})',
            instant=True,
            table=True,
        )
    )
    rename = {f"Value #{ref_id(i)}": label for i, (_, _, label) in enumerate(columns)}
    rename[f"Value #{ref_id(len(columns))}"] = "failed requests"
    return [
        row("Loadgen runs compared"),
        panel(
            "table",
            "Loadgen runs",
            targets,
            w=24,
            h=9,
            transformations=merged_columns(rename),
            description="One row per `loadgen --pushgateway` run (pushed under job=loadgen, "
            "grouped by run_id).",
        ),
        bars_by(
            "run_id",
            "Decode vs prefill tok/s by run",
            [
                (
                    f'max by (run_id) (loadgen_prefill_tokens_per_second{{stat="mean",{sel}}})',
                    "prefill",
                    "prefill tok/s (mean)",
                ),
                (
                    f'max by (run_id) (loadgen_decode_tokens_per_second{{stat="mean",{sel}}})',
                    "decode",
                    "decode tok/s (mean)",
                ),
            ],
            w=24,
            unit="tps",
            orientation="horizontal",
        ),
    ]


def agent_row() -> list[Panel]:
    """`loadgen --workload agent`: what each turn of a growing conversation costs."""
    sel = 'run_id=~"$run_id"'
    return [
        row("Agent sessions (loadgen --workload agent)"),
        bars_by(
            "turn",
            "Agent: TTFT and prefill of the new tokens, by turn",
            [
                (
                    f'max by (turn) (loadgen_agent_ttft_seconds{{stat="p50",{sel}}})',
                    "TTFT p50",
                    "TTFT p50 (s)",
                ),
                (
                    "max by (turn) (loadgen_agent_prefill_new_tokens_per_second"
                    f'{{stat="p50",{sel}}})',
                    "prefill new tok/s p50",
                    "prefill of new tokens p50 (tok/s)",
                ),
            ],
            w=18,
            unit="s",
            orientation="vertical",
            description="Each turn resends the whole conversation; with the prefix cache only "
            "the new tokens should cost prefill, so TTFT should stay flat as the context grows.",
        ),
        panel(
            "stat",
            "Agent: prefix-cache hit rate",
            [
                target(
                    f"max by (run_id) (loadgen_prefix_cache_hit_ratio{{{sel}}})",
                    "{{run_id}}",
                    instant=True,
                )
            ],
            w=6,
            h=9,
            unit="percentunit",
            options={"reduceOptions": {"calcs": ["lastNotNull"], "values": False}},
            description="Prompt tokens the engine served from its prefix cache over the run "
            "(vllm:prefix_cache_hits / queries, read by loadgen before and after).",
        ),
    ]


def layout(panels: list[Panel]) -> list[Panel]:
    """Give ids and flow panels left to right, top to bottom, in a 24-column grid."""
    x = y = row_h = 0
    out = []
    for panel_id, p in enumerate(panels, start=1):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > WIDTH:
            x, y, row_h = 0, y + row_h, 0
        out.append(p | {"id": panel_id, "gridPos": {"x": x, "y": y, "w": w, "h": h}})
        x, row_h = x + w, max(row_h, h)
    return out


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-variable"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }


def dashboard() -> dict[str, Any]:
    panels = [
        *tokens_row(),
        *latency_row(),
        *load_row(),
        *gpu_row(),
        *plan_row(),
        *runs_row(),
        *agent_row(),
    ]
    return {
        "uid": UID,
        "title": "toposerve: prefill vs decode",
        "description": "vLLM behind the toposerve proxy: token rates, latency, load, GPUs, "
        "the plan in force and loadgen runs.",
        "tags": ["toposerve", "vllm", "llm"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                variable("model", "Model", "label_values(vllm:num_requests_running, model_name)"),
                variable(
                    "run_id", "loadgen run", "label_values(loadgen_run_timestamp_seconds, run_id)"
                ),
            ]
        },
        "panels": layout(panels),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the committed JSON differs from what this script renders",
    )
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run `python {Path(__file__).as_posix()}`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
