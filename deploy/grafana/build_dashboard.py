"""Generate deploy/grafana/dashboards/toposerve.json, the dashboard Grafana provisions.

    python deploy/grafana/build_dashboard.py           # rewrite the JSON
    python deploy/grafana/build_dashboard.py --check   # exit 1 if the committed JSON is stale

Panels are typed objects of Grafana's own Python SDK (grafana-foundation-sdk, generated from
Grafana's schema; the release for the Grafana that deploy/compose.yaml runs, 11.3), so a
misspelt option or a wrong enum value is a type error here rather than a panel Grafana silently
ignores. The SDK also lays the panels out (rows of 24 columns). The committed JSON is what
Grafana loads; CI checks that it equals this script's output and evaluates every query in it
against a real Prometheus.

Grafana variables used in queries: $model (vLLM's model_name, the proxy's model), $run_id
(loadgen runs) and $__rate_interval.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from grafana_foundation_sdk.builders import barchart, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog import builder as cog
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prom_model

OUTPUT = Path(__file__).parent / "dashboards" / "toposerve.json"
UID = "toposerve"
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"))
RATE = "$__rate_interval"
VLLM_SEL = 'model_name=~"$model"'
PROXY_SEL = 'model=~"$model"'
RUN_SEL = 'run_id=~"$run_id"'

Panel = cog.Builder[model.Panel]
Query = prom.Dataquery


def target(expr: str, legend: str = "", *, instant: bool = False, table: bool = False) -> Query:
    """One query; refIds are assigned by the panel in order."""
    q = prom.Dataquery().expr(expr).legend_format(legend or "__auto").datasource(DATASOURCE)
    if instant:
        q = q.instant()
    if table:
        q = q.format(prom_model.PromQueryFormat.TABLE)
    return q


def quantile_targets(bucket: str, selector: str, prefix: str = "") -> list[Query]:
    return [
        target(
            f"histogram_quantile({q}, sum by (le) (rate({bucket}{{{selector}}}[{RATE}])))",
            f"{prefix}{name}",
        )
        for q, name in QUANTILES
    ]


def ref_id(i: int) -> str:
    """The refId of a panel's i-th query; an instant table query's value column is
    ``Value #<refId>``."""
    return chr(ord("A") + i)


P = TypeVar("P", timeseries.Panel, barchart.Panel, stat.Panel, table.Panel)


def with_queries(
    panel: P, title: str, queries: Sequence[Query], *, w: int, h: int, unit: str,
    description: str,
) -> P:
    """What every panel has: title, the dashboard's datasource, its queries, size and unit."""
    panel = panel.title(title).description(description).datasource(DATASOURCE)
    for i, q in enumerate(queries):
        panel = panel.with_target(q.ref_id(ref_id(i)))
    return panel.span(w).height(h).unit(unit)


def timeseries_panel(
    title: str, queries: Sequence[Query], *, w: int = 12, unit: str = "short",
    description: str = "",
) -> timeseries.Panel:
    legend = (
        common_b.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["lastNotNull", "max"])
    )
    tooltip = (
        common_b.VizTooltipOptions()
        .mode(common.TooltipDisplayMode.MULTI)
        .sort(common.SortOrder.DESCENDING)
    )
    panel = timeseries.Panel().legend(legend).tooltip(tooltip)
    return with_queries(panel, title, queries, w=w, h=8, unit=unit, description=description)


def merged_columns(rename: dict[str, str]) -> list[model.DataTransformerConfig]:
    """Transformations that join instant table queries into one row per label set, drop the
    time column and name the value columns."""
    return [
        model.DataTransformerConfig(id_val="merge", options={}),
        model.DataTransformerConfig(
            id_val="organize",
            options={"excludeByName": {"Time": True}, "renameByName": rename},
        ),
    ]


def bars_by(
    label: str,
    title: str,
    series: Sequence[tuple[str, str, str]],
    *,
    w: int,
    unit: str,
    orientation: common.VizOrientation,
    description: str = "",
) -> barchart.Panel:
    """A bar chart of instant queries, one group of bars per value of ``label``; ``series`` is
    (query, legend, column name) per bar."""
    legend = (
        common_b.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
    )
    panel = (
        barchart.Panel()
        .x_field(label)
        .orientation(orientation)
        .show_value(common.VisibilityMode.AUTO)
        .legend(legend)
        .transformations(
            merged_columns({f"Value #{ref_id(i)}": col for i, (_, _, col) in enumerate(series)})
        )
    )
    queries = [target(expr, legend, instant=True, table=True) for expr, legend, _ in series]
    return with_queries(panel, title, queries, w=w, h=9, unit=unit, description=description)


def table_of(
    title: str,
    columns: Sequence[tuple[str, str]],
    keys: str,
    *,
    w: int = 24,
    h: int = 9,
    description: str = "",
) -> table.Panel:
    """One row per label set of ``keys``, one column per (query, column name)."""
    queries = [target(f"max by ({keys}) ({expr})", instant=True, table=True) for expr, _ in columns]
    rename = {f"Value #{ref_id(i)}": name for i, (_, name) in enumerate(columns)}
    panel = table.Panel().transformations(merged_columns(rename))
    return with_queries(panel, title, queries, w=w, h=h, unit="short", description=description)


def stat_panel(
    title: str, queries: Sequence[Query], *, w: int, h: int, unit: str = "short",
    description: str = "", text_mode: common.BigValueTextMode | None = None,
) -> stat.Panel:
    reduce = common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False)
    panel = stat.Panel().reduce_options(reduce)
    if text_mode is not None:
        panel = (
            panel.text_mode(text_mode)
            .color_mode(common.BigValueColorMode.NONE)
            .graph_mode(common.BigValueGraphMode.NONE)
        )
    return with_queries(panel, title, queries, w=w, h=h, unit=unit, description=description)


Section = tuple[str, list[Panel]]  # a row's title and its panels


def tokens_row() -> Section:
    return "Prefill vs decode", [
        timeseries_panel(
            "Prefill vs decode tok/s (vLLM)",
            [
                target(
                    f"sum by (model_name) (rate(vllm:prompt_tokens_total{{{VLLM_SEL}}}[{RATE}]))",
                    "prefill {{model_name}}",
                ),
                target(
                    "sum by (model_name) "
                    f"(rate(vllm:generation_tokens_total{{{VLLM_SEL}}}[{RATE}]))",
                    "decode {{model_name}}",
                ),
            ],
            unit="tps",
            description="Tokens vLLM prefilled (prompt) and generated per second.",
        ),
        timeseries_panel(
            "Prefill vs decode tok/s (proxy, 1m recording rules)",
            [
                target(f"model:toposerve_prompt_tokens:rate1m{{{PROXY_SEL}}}", "prompt {{model}}"),
                target(
                    f"model:toposerve_generation_tokens:rate1m{{{PROXY_SEL}}}",
                    "generated {{model}}",
                ),
            ],
            unit="tps",
            description="Usage the proxy returned to clients (finished requests).",
        ),
        timeseries_panel(
            "Prefill vs decode tok/s per request (loadgen runs)",
            [
                target(
                    f'loadgen_prefill_tokens_per_second{{stat="p50",{RUN_SEL}}}',
                    "prefill p50 {{run_id}}",
                ),
                target(
                    f'loadgen_decode_tokens_per_second{{stat="p50",{RUN_SEL}}}',
                    "decode p50 {{run_id}}",
                ),
            ],
            w=24,
            unit="tps",
            description="Client-side: prompt tokens / TTFT and (completion tokens - 1) / decode "
            "time of each request, medians per run.",
        ),
    ]


def latency_row() -> Section:
    return "Latency", [
        timeseries_panel(
            "TTFT percentiles (proxy)",
            quantile_targets("toposerve_ttft_seconds_bucket", PROXY_SEL),
            unit="s",
        ),
        timeseries_panel(
            "TTFT percentiles (vLLM)",
            quantile_targets("vllm:time_to_first_token_seconds_bucket", VLLM_SEL),
            unit="s",
        ),
        timeseries_panel(
            "Inter-token latency percentiles (proxy)",
            quantile_targets("toposerve_itl_seconds_bucket", PROXY_SEL),
            unit="s",
        ),
        timeseries_panel(
            "Inter-token latency percentiles (vLLM)",
            quantile_targets("vllm:inter_token_latency_seconds_bucket", VLLM_SEL),
            unit="s",
        ),
        timeseries_panel(
            "End-to-end latency percentiles",
            [
                *quantile_targets("toposerve_e2e_seconds_bucket", PROXY_SEL, "proxy "),
                *quantile_targets("vllm:e2e_request_latency_seconds_bucket", VLLM_SEL, "vLLM "),
            ],
            unit="s",
        ),
        timeseries_panel(
            "Time in vLLM's queue vs prefill",
            [
                *quantile_targets("vllm:request_queue_time_seconds_bucket", VLLM_SEL, "queue ")[
                    ::2
                ],
                *quantile_targets("vllm:request_prefill_time_seconds_bucket", VLLM_SEL, "prefill ")[
                    ::2
                ],
            ],
            unit="s",
            description="p50 and p99 of the time requests wait for a slot and spend in prefill.",
        ),
    ]


def hit_rate(hits: str, queries: str, selector: str, by: str) -> str:
    # clamp_min: an idle engine reads 0, not 0/0
    return (
        f"sum by ({by}) (rate({hits}{{{selector}}}[{RATE}])) / clamp_min("
        f"sum by ({by}) (rate({queries}{{{selector}}}[{RATE}])), 1e-9)"
    )


def load_row() -> Section:
    return "Requests and KV cache", [
        timeseries_panel(
            "Running / waiting requests",
            [
                target(
                    f"sum by (model_name) (vllm:num_requests_running{{{VLLM_SEL}}})",
                    "vLLM running {{model_name}}",
                ),
                target(
                    f"sum by (model_name) (vllm:num_requests_waiting{{{VLLM_SEL}}})",
                    "vLLM waiting {{model_name}}",
                ),
                target(
                    f"sum by (model) (toposerve_requests_in_flight{{{PROXY_SEL}}})",
                    "proxy in flight {{model}}",
                ),
                target("sum(toposerve_requests_queued)", "proxy queued"),
            ],
        ),
        timeseries_panel(
            "KV-cache use",
            [
                target(f"vllm:kv_cache_usage_perc{{{VLLM_SEL}}}", "{{model_name}} {{engine}}"),
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
        timeseries_panel(
            "Requests/s by status (proxy)",
            [
                target(
                    "sum by (route, status) "
                    f"(rate(toposerve_requests_total{{{PROXY_SEL}}}[{RATE}]))",
                    "{{route}} {{status}}",
                ),
            ],
            unit="reqps",
        ),
        timeseries_panel(
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


def cache_row() -> Section:
    """What keeps an agent's prefix warm: vLLM's prefix cache and its KV offloading."""
    return "Prefix cache and KV offloading (vLLM)", [
        timeseries_panel(
            "Prefix-cache hit rate (vLLM)",
            [
                target(
                    hit_rate("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
                             VLLM_SEL, "model_name"),
                    "GPU prefix cache {{model_name}}",
                ),
            ],
            unit="percentunit",
            description="Share of prompt tokens vLLM found in its own prefix cache "
            "(vllm:prefix_cache_hits / queries). An agent's later turns should hit most of "
            "their prompt.",
        ),
        timeseries_panel(
            "KV offloading: hits from host memory",
            [
                target(
                    hit_rate("vllm:external_prefix_cache_hits_total",
                             "vllm:external_prefix_cache_queries_total", VLLM_SEL, "model_name"),
                    "offloaded prefix hit rate {{model_name}}",
                ),
                target(
                    f"max by (model_name) (vllm:kv_offload_cpu_cache_usage_perc{{{VLLM_SEL}}})",
                    "host KV cache use {{model_name}}",
                ),
            ],
            unit="percentunit",
            description="With KV offloading (--kv-offloading-backend native or LMCache): the "
            "share of prompt tokens served from the offloaded cache (vllm:external_prefix_cache_"
            "*), and how full the host-memory cache is.",
        ),
        timeseries_panel(
            "KV offloading: bytes moved per second",
            [
                target(
                    f"sum by (model_name) (rate(vllm:kv_offload_store_bytes_total{{{VLLM_SEL}}}"
                    f"[{RATE}]))",
                    "GPU -> host {{model_name}}",
                ),
                target(
                    f"-sum by (model_name) (rate(vllm:kv_offload_load_bytes_total{{{VLLM_SEL}}}"
                    f"[{RATE}]))",
                    "host -> GPU {{model_name}}",
                ),
            ],
            w=24,
            unit="Bps",
            description="KV blocks stored to host memory (positive) and loaded back (negative): "
            "the PCIe cost of keeping prefixes that do not fit the GPU cache.",
        ),
    ]


def gpu_row() -> Section:
    by_gpu = "gpu {{gpu}} {{name}}"
    return "GPUs (NVML, read by the proxy at scrape time)", [
        timeseries_panel(
            "GPU utilisation",
            [target("toposerve_gpu_utilization_ratio", by_gpu)],
            unit="percentunit",
        ),
        timeseries_panel("GPU power", [target("toposerve_gpu_power_watts", by_gpu)], unit="watt"),
        timeseries_panel(
            "GPU memory used",
            [target("toposerve_gpu_memory_used_bytes / toposerve_gpu_memory_total_bytes", by_gpu)],
            unit="percentunit",
        ),
        timeseries_panel(
            "PCIe throughput (rx negative)",
            [
                target("toposerve_gpu_pcie_tx_bytes_per_second", "tx " + by_gpu),
                target("-toposerve_gpu_pcie_rx_bytes_per_second", "rx " + by_gpu),
            ],
            unit="Bps",
        ),
        timeseries_panel(
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


def plan_row() -> Section:
    plan_columns = ["mode", "tp", "pp", "dp", "transport", "engine", "model", "gpus"]
    plan = table.Panel().transformations(
        [
            model.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "Value": True},
                    "indexByName": {name: i for i, name in enumerate(plan_columns)},
                },
            )
        ]
    )
    return "Plan in force", [
        with_queries(
            plan,
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
            unit="short",
            description="From `launcher plan`: the split chosen and why is in the launcher log.",
        ),
        stat_panel(
            "NCCL transport",
            [target("max by (transport) (toposerve_plan_info)", "{{transport}}", instant=True)],
            w=8,
            h=5,
            text_mode=common.BigValueTextMode.NAME,
            description="How tensor/pipeline traffic moves between GPUs (NVLink, PCIe P2P, "
            "host memory, network).",
        ),
    ]


def runs_row() -> Section:
    keys = "run_id, plan, prompt, gen, concurrency"

    def col(metric: str, stat_name: str | None = None) -> str:
        matcher = f'{{stat="{stat_name}",{RUN_SEL}}}' if stat_name else f"{{{RUN_SEL}}}"
        return f"{metric}{matcher}"

    columns = [
        (col("loadgen_prefill_tokens_per_second", "p50"), "prefill tok/s p50"),
        (col("loadgen_decode_tokens_per_second", "p50"), "decode tok/s p50"),
        (col("loadgen_output_tokens_per_second"), "output tok/s"),
        (col("loadgen_ttft_seconds", "p50"), "TTFT p50"),
        (col("loadgen_ttft_seconds", "p99"), "TTFT p99"),
        (col("loadgen_itl_seconds", "p50"), "ITL p50"),
        (col("loadgen_itl_seconds", "p99"), "ITL p99"),
        (f'loadgen_requests_total{{outcome="failed",{RUN_SEL}}}', "failed requests"),
    ]
    return "Loadgen runs compared", [
        table_of(
            "Loadgen runs",
            columns,
            keys,
            description="One row per `loadgen --pushgateway` run (pushed under job=loadgen, "
            "grouped by run_id).",
        ),
        bars_by(
            "run_id",
            "Decode vs prefill tok/s by run",
            [
                (
                    f'max by (run_id) (loadgen_prefill_tokens_per_second{{stat="mean",{RUN_SEL}}})',
                    "prefill",
                    "prefill tok/s (mean)",
                ),
                (
                    f'max by (run_id) (loadgen_decode_tokens_per_second{{stat="mean",{RUN_SEL}}})',
                    "decode",
                    "decode tok/s (mean)",
                ),
            ],
            w=24,
            unit="tps",
            orientation=common.VizOrientation.HORIZONTAL,
        ),
    ]


def depth_row() -> Section:
    """`loadgen --depth`: what a new prompt costs after D tokens of context."""
    sel = f'depth!="",{RUN_SEL}'
    keys = "run_id, depth, depth_mode, prompt, concurrency"
    return "At depth (loadgen --depth)", [
        bars_by(
            "depth",
            "TTFT by depth",
            [
                (
                    f'max by (depth) (loadgen_ttft_seconds{{stat="p50",{sel}}})',
                    "TTFT p50",
                    "TTFT p50 (s)",
                ),
                (
                    f'max by (depth) (loadgen_ttft_seconds{{stat="p90",{sel}}})',
                    "TTFT p90",
                    "TTFT p90 (s)",
                ),
            ],
            w=12,
            unit="s",
            orientation=common.VizOrientation.VERTICAL,
            description="Time to the first token of --prompt new tokens after each depth's "
            "context (cached unless the run was --depth-cold).",
        ),
        table_of(
            "Runs at depth",
            [
                (f'loadgen_ttft_seconds{{stat="p50",{sel}}}', "TTFT p50"),
                (f'loadgen_depth_prefill_new_tokens_per_second{{stat="p50",{sel}}}',
                 "prefill of new tokens p50"),
                (f'loadgen_decode_tokens_per_second{{stat="p50",{sel}}}', "decode tok/s p50"),
                (f'loadgen_depth_cached_tokens{{stat="p50",{sel}}}', "cached tokens p50"),
            ],
            keys,
            w=12,
            description="Per run and depth: TTFT, prefill rate of the new tokens, decode rate at "
            "that depth and the cached tokens the server reported (usage).",
        ),
    ]


def agent_row() -> Section:
    """`loadgen --workload agent`: what each turn of a growing conversation costs."""
    return "Agent sessions (loadgen --workload agent)", [
        bars_by(
            "turn",
            "Agent: TTFT and prefill of the new tokens, by turn",
            [
                (
                    f'max by (turn) (loadgen_agent_ttft_seconds{{stat="p50",{RUN_SEL}}})',
                    "TTFT p50",
                    "TTFT p50 (s)",
                ),
                (
                    "max by (turn) (loadgen_agent_prefill_new_tokens_per_second"
                    f'{{stat="p50",{RUN_SEL}}})',
                    "prefill new tok/s p50",
                    "prefill of new tokens p50 (tok/s)",
                ),
            ],
            w=18,
            unit="s",
            orientation=common.VizOrientation.VERTICAL,
            description="Each turn resends the whole conversation; with the prefix cache only "
            "the new tokens should cost prefill, so TTFT should stay flat as the context grows.",
        ),
        stat_panel(
            "Agent: prefix-cache hit rate",
            [
                target(
                    f"max by (run_id) (loadgen_prefix_cache_hit_ratio{{{RUN_SEL}}})",
                    "{{run_id}}",
                    instant=True,
                )
            ],
            w=6,
            h=9,
            unit="percentunit",
            description="Prompt tokens the engine served from its prefix cache over the run "
            "(vllm:prefix_cache_hits / queries, read by loadgen before and after).",
        ),
        table_of(
            "Agent: TTFT per turn at its context",
            [
                (f'loadgen_agent_prompt_tokens{{stat="mean",{RUN_SEL}}}', "prompt tokens"),
                (f'loadgen_agent_ttft_seconds{{stat="p50",{RUN_SEL}}}', "TTFT p50 (s)"),
                (f'loadgen_agent_ttft_seconds{{stat="p90",{RUN_SEL}}}', "TTFT p90 (s)"),
                (f'loadgen_agent_prefix_cache_hit_ratio{{{RUN_SEL}}}', "cache hit (usage)"),
            ],
            "run_id, turn",
            description="One row per run and turn: how deep the conversation was and what its "
            "first token cost (a soak, --soak-tokens, runs past 32k tokens).",
        ),
    ]


def query_variable(name: str, label: str, query: str) -> dash.QueryVariable:
    return (
        dash.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": f"{name}-variable"})
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(model.VariableOption(selected=True, text=["All"], value=["$__all"]))
    )


SECTIONS = (
    tokens_row, latency_row, load_row, cache_row, gpu_row, plan_row, runs_row, depth_row,
    agent_row,
)


def dashboard() -> dash.Dashboard:
    board = (
        dash.Dashboard("toposerve: prefill vs decode")
        .uid(UID)
        .description(
            "vLLM behind the toposerve proxy: token rates, latency, load, the prefix cache and "
            "KV offloading, GPUs, the plan in force and loadgen runs (at depth, agent sessions)."
        )
        .tags(["toposerve", "vllm", "llm"])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .refresh("10s")
        .time("now-1h", "now")
        .timezone("")
        .with_variable(
            dash.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
        .with_variable(
            query_variable("model", "Model", "label_values(vllm:num_requests_running, model_name)")
        )
        .with_variable(
            query_variable(
                "run_id", "loadgen run", "label_values(loadgen_run_timestamp_seconds, run_id)"
            )
        )
    )
    for section in SECTIONS:
        title, panels = section()
        board = board.with_row(dash.Row(title))
        for panel in panels:
            board = board.with_panel(panel)
    return board


def as_dict() -> dict[str, Any]:
    """The dashboard JSON model, with a unique id for every panel (rows included)."""
    data: dict[str, Any] = json.loads(json.dumps(dashboard().build(), cls=JSONEncoder))
    for panel_id, panel in enumerate(data["panels"], start=1):
        panel["id"] = panel_id
    return data


def render() -> str:
    return json.dumps(as_dict(), indent=2, sort_keys=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
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
