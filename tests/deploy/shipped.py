"""The shipped deploy files, read and rendered for tests (pure functions, no processes).

Tests evaluate what users get: the dashboard JSON Grafana loads, the recording rules Prometheus
loads, and deploy/prometheus/prometheus.yml with only its targets and intervals replaced.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
RULES_DIR = DEPLOY / "prometheus" / "rules"
DASHBOARD_JSON = DEPLOY / "grafana" / "dashboards" / "toposerve.json"

# Metric names this project scrapes: vLLM's, the proxy's, loadgen's and the recording rules'
# (level:metric:operation). Function names and label names never match these shapes.
_METRIC = re.compile(
    r"\b(?:vllm:[a-zA-Z0-9_]+|toposerve_[a-zA-Z0-9_]+|loadgen_[a-zA-Z0-9_]+"
    r"|[a-z_]+:[a-zA-Z0-9_]+:[a-zA-Z0-9_]+)"
)
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True)
class Query:
    """One PromQL expression the user sees: a panel target or a recording rule."""

    where: str  # panel title or rule group
    ref: str  # refId or recorded name
    expr: str

    @property
    def metrics(self) -> frozenset[str]:
        return frozenset(_METRIC.findall(self.expr))

    def __str__(self) -> str:
        return f"{self.where} [{self.ref}]: {self.expr}"


def load_dashboard(path: Path = DASHBOARD_JSON) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def all_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those folded inside collapsed rows."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[Query]:
    return [
        Query(panel["title"], target["refId"], target["expr"])
        for panel in all_panels(dashboard)
        for target in panel.get("targets", [])
    ]


def rule_queries(rules_dir: Path = RULES_DIR) -> list[Query]:
    queries = []
    for path in sorted(rules_dir.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                name = rule.get("record") or rule["alert"]
                queries.append(Query(group["name"], name, rule["expr"]))
    return queries


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace Grafana's $var / ${var} the way Grafana would; unknown variables raise KeyError."""
    return _VARIABLE.sub(lambda m: values[m.group(1) or m.group(2)], expr)


def render_prometheus_config(
    targets: Mapping[str, str], *, interval: str, rules_dir: Path = RULES_DIR
) -> str:
    """deploy/prometheus/prometheus.yml with each job's target, the intervals and the rule path
    replaced; every other setting (honor_labels, job names, paths) is the shipped one.

    `targets` must name exactly the shipped jobs, so that a renamed job fails loudly.
    """
    config: dict[str, Any] = yaml.safe_load(PROMETHEUS_YML.read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    if jobs != set(targets):
        raise ValueError(f"shipped jobs {sorted(jobs)} differ from the targets {sorted(targets)}")
    config["global"] |= {"scrape_interval": interval, "evaluation_interval": interval}
    config["rule_files"] = [str(rules_dir / Path(f).name) for f in config["rule_files"]]
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
    return yaml.safe_dump(config, sort_keys=False)
