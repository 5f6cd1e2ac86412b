"""Real Prometheus and Pushgateway processes for tests, and their HTTP API.

Debian's packages provide the binaries (`apt-get install prometheus prometheus-pushgateway`).
Each server runs on a free loopback port with its data in a directory the caller owns (pytest's
`tmp_path`), is waited on until `/-/ready` answers, and is always terminated on exit.

    with pushgateway(tmp_path / "pgw") as pgw_url, prometheus(
        scrape_config({"loadgen": [host_port(pgw_url)]}), tmp_path / "prom"
    ) as prom_url:
        ...push to pgw_url...
        rows = wait_for(prom_url, 'loadgen_ttft_seconds{stat="p50"}', timeout=20)

As a pytest fixture:

    @pytest.fixture
    def prom_url(tmp_path: Path) -> Iterator[str]:
        with prometheus(scrape_config({"proxy": ["127.0.0.1:8000"]}), tmp_path) as url:
            yield url
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from simengine.engine import stop_process

# Tests want a new sample every second; production configs use 15 s.
TEST_SCRAPE_INTERVAL = "1s"
_READY_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0


class PromSupportError(Exception):
    """A test Prometheus/Pushgateway could not be started or answered with an error."""


class BinaryMissing(PromSupportError):
    """The Debian binary is not installed."""


class QueryError(PromSupportError):
    """Prometheus rejected a query (bad PromQL, unknown function, ...)."""

    def __init__(self, promql: str, error_type: str, error: str) -> None:
        super().__init__(f"{error_type}: {error} (query: {promql})")
        self.promql = promql
        self.error_type = error_type
        self.error = error


def binary(name: str) -> str:
    """Path of `name` (env TOPOSERVE_<NAME>_BIN overrides), or BinaryMissing with the fix."""
    env_name = "TOPOSERVE_" + name.upper().replace("-", "_") + "_BIN"
    found = os.environ.get(env_name) or shutil.which(name)
    if not found:
        raise BinaryMissing(
            f"{name} is not installed: run `apt-get install -y prometheus prometheus-pushgateway`"
            f" (or set {env_name} to its path)"
        )
    return found


def free_port() -> int:
    """A loopback port free right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def host_port(url: str) -> str:
    """'http://127.0.0.1:9091' -> '127.0.0.1:9091', the form scrape targets take."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def scrape_config(
    jobs: Mapping[str, Sequence[str]],
    *,
    interval: str = TEST_SCRAPE_INTERVAL,
    rule_files: Sequence[Path] = (),
) -> str:
    """A minimal prometheus.yml scraping `jobs` ({job_name: ["host:port", ...]}).

    honor_labels is on so that series pushed to a Pushgateway keep their own job/instance.
    """
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {"job_name": job, "honor_labels": True, "static_configs": [{"targets": list(targets)}]}
            for job, targets in jobs.items()
        ],
    }
    if rule_files:
        config["rule_files"] = [str(path) for path in rule_files]
    return yaml.safe_dump(config, sort_keys=False)


@contextmanager
def prometheus(config_text: str, workdir: Path) -> Iterator[str]:
    """Run Prometheus with `config_text` as its config; yields its base URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(config_text)
    port = free_port()
    argv = [
        binary("prometheus"),
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        "--log.level=warn",
    ]
    with _running(argv, f"http://127.0.0.1:{port}", workdir / "prometheus.log") as url:
        yield url


@contextmanager
def pushgateway(workdir: Path) -> Iterator[str]:
    """Run a Pushgateway (in-memory, nothing persisted); yields its base URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
        binary("prometheus-pushgateway"),
        f"--web.listen-address=127.0.0.1:{port}",
        # Debian's build defaults this to /var/lib/prometheus/pushgateway.data, one file for every
        # Pushgateway on the machine: each wrote its groups there on exit and the next loaded
        # them, so a test's Prometheus scraped an earlier run's group of the same job and run_id
        # (its values, not this run's) until the new push replaced it. Empty: memory only.
        "--persistence.file=",
        "--log.level=warn",
    ]
    with _running(argv, f"http://127.0.0.1:{port}", workdir / "pushgateway.log") as url:
        yield url


@contextmanager
def _running(argv: list[str], url: str, log_path: Path) -> Iterator[str]:
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(proc, url, log_path)
            yield url
        finally:
            _stop(proc)


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PromSupportError(
                f"{log_path.stem} exited with {proc.returncode}: {_tail(log_path)}"
            )
        try:
            if httpx.get(f"{url}/-/ready", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise PromSupportError(f"{url} not ready after {_READY_TIMEOUT_S:.0f} s: {_tail(log_path)}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        stop_process(proc, _STOP_TIMEOUT_S)


def _tail(path: Path, limit: int = 2000) -> str:
    return path.read_text(errors="replace")[-limit:]


def query(url: str, promql: str, *, at: float | None = None) -> list[dict[str, Any]]:
    """Evaluate `promql` (instant query) and return the result rows.

    Vector rows are {"metric": {...}, "value": [ts, "v"]}; a scalar or string result comes back
    as one row {"metric": {}, "value": [ts, "v"]}. A rejected query raises QueryError.
    """
    params: dict[str, str] = {"query": promql}
    if at is not None:
        params["time"] = repr(at)
    response = httpx.get(f"{url}/api/v1/query", params=params, timeout=30.0)
    body = response.json()
    if body.get("status") != "success":
        raise QueryError(promql, body.get("errorType", "?"), body.get("error", response.text))
    data = body["data"]
    if data["resultType"] in ("scalar", "string"):
        return [{"metric": {}, "value": data["result"]}]
    return list(data["result"])


def wait_for(
    url: str,
    promql: str,
    timeout: float,
    *,
    poll_s: float = 0.5,
    until: Callable[[list[dict[str, Any]]], bool] | None = None,
) -> list[dict[str, Any]]:
    """Poll `promql` until it returns at least one row (and ``until(rows)`` holds, when given:
    a scrape that fell between two pushes of one run shows only the first series, so a test
    that expects several waits for all of them); TimeoutError if it never does.

    A query Prometheus rejects fails at once (QueryError): waiting would not fix it.
    """
    deadline = time.monotonic() + timeout
    while True:
        rows = query(url, promql)
        if rows and (until is None or until(rows)):
            return rows
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no data for {promql!r} after {timeout:.0f} s at {url}"
                               + (f" that satisfies the test (last: {rows})" if rows else ""))
        time.sleep(poll_s)


def targets_health(url: str) -> dict[str, str]:
    """{scrape_url: "up"|"down"|"unknown"} of the active targets, with the last error if any."""
    body = httpx.get(f"{url}/api/v1/targets", timeout=10.0).json()
    health: dict[str, str] = {}
    for target in body["data"]["activeTargets"]:
        error = target.get("lastError") or ""
        health[target["scrapeUrl"]] = target["health"] + (f" ({error})" if error else "")
    return health
