"""The GPU-only panels against metrics recorded on a real GPU machine.

CI has no GPU, so the proxy's GPU collector exposes nothing there. What it exposed on a lent
2×H200 machine (NV18 between the two) was recorded with record_gpu_metrics.py into recorded/: two
scrapes a few seconds apart, both taken before the GPU work of that run had started, so they show
idle GPUs (power and PCIe figures differ, utilisation and NVLink counters are 0). A loopback HTTP
server replays them to a real Prometheus configured with the shipped prometheus.yml, and every
GPU-only query of the dashboard and of the recording rules must then return finite data.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.deploy.feeds import GPU_ONLY_PANELS, GPU_ONLY_RULES
from tests.deploy.shipped import (
    dashboard_queries,
    load_dashboard,
    render_prometheus_config,
    rule_queries,
    substitute,
)
from tests.support.prom import free_port, prometheus, query, wait_for

pytestmark = pytest.mark.prometheus

RECORDED = Path(__file__).parent / "recorded"
SCRAPES = [RECORDED / "h200x2-scrape1.prom", RECORDED / "h200x2-scrape2.prom"]
# Scrapes answered with the first recording before the second takes over.
FIRST_SCRAPES = 3


class Replay(BaseHTTPRequestHandler):
    served = 0

    def do_GET(self) -> None:
        Replay.served += 1
        body = SCRAPES[0 if Replay.served <= FIRST_SCRAPES else 1].read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    Replay.served = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    nobody = f"127.0.0.1:{free_port()}"  # vLLM and the Pushgateway are not part of this test
    config = render_prometheus_config(
        {"toposerve-proxy": f"127.0.0.1:{server.server_port}", "vllm": nobody,
         "pushgateway": nobody},
        interval="1s",
    )  # fmt: skip
    try:
        with prometheus(config, tmp_path_factory.mktemp("gpu-replay")) as url:
            wait_for(url, "gpu:toposerve_gpu_nvlink_tx_bytes:rate1m", timeout=30)
            yield url
    finally:
        server.shutdown()
        server.server_close()


def test_the_recording_holds_every_gpu_metric_for_two_gpus() -> None:
    text = SCRAPES[1].read_text()
    for metric in ("utilization_ratio", "memory_used_bytes", "memory_total_bytes",
                   "power_watts", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second",
                   "nvlink_tx_bytes_total", "nvlink_rx_bytes_total"):  # fmt: skip
        assert f'toposerve_gpu_{metric}{{gpu="1"' in text, metric


def test_every_gpu_only_query_returns_data_from_recorded_gpus(prom_url: str) -> None:
    values = {"__rate_interval": "1m", "model": ".*", "run_id": ".*"}
    queries = [q for q in dashboard_queries(load_dashboard()) if q.where in GPU_ONLY_PANELS]
    queries += [q for q in rule_queries() if q.ref in GPU_ONLY_RULES]
    empty = []
    for q in queries:
        rows = query(prom_url, substitute(q.expr, values))
        if not [r for r in rows if math.isfinite(float(r["value"][1]))]:
            empty.append(str(q))
    assert not empty, "no data from the recorded GPUs:\n" + "\n".join(empty)


def test_every_recorded_gpu_gets_its_own_series(prom_url: str) -> None:
    for expr in ("toposerve_gpu_power_watts", "rate(toposerve_gpu_nvlink_tx_bytes_total[1m])"):
        rows = query(prom_url, expr)
        assert {(r["metric"]["gpu"], r["metric"]["name"]) for r in rows} == {
            ("0", "NVIDIA H200"),
            ("1", "NVIDIA H200"),
        }, expr
