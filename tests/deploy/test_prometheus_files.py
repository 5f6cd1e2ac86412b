"""deploy/prometheus/: promtool's own checks, and the recording rules' unit tests."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.deploy.shipped import PROMETHEUS_YML, RULES_DIR
from tests.support.prom import binary

pytestmark = pytest.mark.prometheus

PROM_DIR = PROMETHEUS_YML.parent


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    # From deploy/prometheus/, as in the compose mount: rule_files paths are relative to it.
    return subprocess.run(
        [binary("promtool"), *args], cwd=PROM_DIR, capture_output=True, text=True, check=False
    )


def test_promtool_accepts_the_shipped_config_and_finds_its_rules() -> None:
    done = promtool("check", "config", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    rule_files = sorted(RULES_DIR.glob("*.yml"))
    assert rule_files
    assert f"SUCCESS: {len(rule_files)} rule files found" in done.stdout + done.stderr


def test_promtool_accepts_every_rule_file() -> None:
    files = [str(p.relative_to(PROM_DIR)) for p in sorted(RULES_DIR.glob("*.yml"))]
    done = promtool("check", "rules", *files)
    assert done.returncode == 0, done.stdout + done.stderr


def test_recording_rules_compute_known_rates_and_percentiles() -> None:
    done = promtool("test", "rules", "tests/toposerve.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_recording_rule_has_a_unit_test() -> None:
    recorded = {
        rule["record"]
        for path in RULES_DIR.glob("*.yml")
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    }
    unit = yaml.safe_load((PROM_DIR / "tests" / "toposerve.test.yml").read_text())
    tested = {case["expr"] for test in unit["tests"] for case in test["promql_expr_test"]}
    untested = recorded - tested
    # Percentiles other than p50 interpolate the same way; their floats do not compare exactly.
    untested -= {r for r in recorded if r.endswith(("p90_5m", "p99_5m"))}
    assert not untested, f"recording rules without a promtool unit test: {sorted(untested)}"


def test_pushgateway_job_keeps_the_pushed_labels() -> None:
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["pushgateway"].get("honor_labels") is True
    assert set(jobs) == {"toposerve-proxy", "vllm", "pushgateway"}
