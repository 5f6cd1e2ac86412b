"""``--workers N``: N proxy processes on one port (server.workers), with limits split, /metrics
answering for all of them, and no worker outliving the others or the parent."""

from __future__ import annotations

import functools
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from server.config import ProxyConfig, config_from_args
from server.errors import ConfigError
from server.metrics import merge_worker_metrics
from server.workers import listeners, split_limits
from tests.server.conftest import SpawnProxy, wait_for
from tests.server.hostile import connect, holds_connection, metrics_text, post_json


def metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(
                f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def held_by_one(workers: list[int], sock: socket.socket) -> bool:
    return any(holds_connection(w, sock) for w in workers)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


# -- pure parts ------------------------------------------------------------------------------------

def test_limits_are_totals_split_evenly_and_rounded_up() -> None:
    cfg = ProxyConfig(upstreams=("http://127.0.0.1:1",), max_in_flight=1024, max_queue=5,
                      max_connections=3, workers=4)
    share = split_limits(cfg, 4)
    assert (share.max_in_flight, share.max_queue, share.max_connections) == (256, 2, 1)
    assert split_limits(cfg, 1) is cfg
    assert split_limits(ProxyConfig(upstreams=cfg.upstreams, max_queue=0), 2).max_queue == 0


def test_workers_below_one_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--workers"):
        config_from_args(["--upstream", "http://127.0.0.1:1", "--workers", "0"], env={})


WORKER_A = """# HELP toposerve_requests_total Requests
# TYPE toposerve_requests_total counter
toposerve_requests_total{model="m",route="/v1/completions",status="200"} 3.0
# HELP toposerve_ttft_seconds TTFT
# TYPE toposerve_ttft_seconds histogram
toposerve_ttft_seconds_bucket{le="0.1",model="m",route="r"} 1.0
toposerve_ttft_seconds_bucket{le="+Inf",model="m",route="r"} 3.0
toposerve_ttft_seconds_count{model="m",route="r"} 3.0
toposerve_ttft_seconds_sum{model="m",route="r"} 0.9
# HELP toposerve_upstream_up up
# TYPE toposerve_upstream_up gauge
toposerve_upstream_up{upstream="http://e"} 1.0
# HELP toposerve_engine_prefix_cache_hits_total hits
# TYPE toposerve_engine_prefix_cache_hits_total counter
toposerve_engine_prefix_cache_hits_total{upstream="http://e"} 100.0
"""
WORKER_B = """# HELP toposerve_requests_total Requests
# TYPE toposerve_requests_total counter
toposerve_requests_total{model="m",route="/v1/completions",status="200"} 4.0
toposerve_requests_total{model="m",route="/v1/completions",status="429"} 1.0
# HELP toposerve_ttft_seconds TTFT
# TYPE toposerve_ttft_seconds histogram
toposerve_ttft_seconds_bucket{le="0.1",model="m",route="r"} 2.0
toposerve_ttft_seconds_bucket{le="+Inf",model="m",route="r"} 2.0
toposerve_ttft_seconds_count{model="m",route="r"} 2.0
toposerve_ttft_seconds_sum{model="m",route="r"} 0.1
# HELP toposerve_upstream_up up
# TYPE toposerve_upstream_up gauge
toposerve_upstream_up{upstream="http://e"} 0.0
# HELP toposerve_engine_prefix_cache_hits_total hits
# TYPE toposerve_engine_prefix_cache_hits_total counter
toposerve_engine_prefix_cache_hits_total{upstream="http://e"} 90.0
"""


def test_merged_metrics_sum_each_workers_work_and_take_shared_state_once() -> None:
    from prometheus_client.exposition import generate_latest

    from server.metrics import MetricList

    text = generate_latest(MetricList(merge_worker_metrics([WORKER_A, WORKER_B], 3))).decode()  # type: ignore[arg-type]
    assert metric(text, "toposerve_requests_total", status="200") == 7.0
    assert metric(text, "toposerve_requests_total", status="429") == 1.0
    assert metric(text, "toposerve_ttft_seconds_bucket", le="0.1") == 3.0
    assert metric(text, "toposerve_ttft_seconds_count") == 5.0
    assert metric(text, "toposerve_ttft_seconds_sum") == 1.0
    # the engine's state and its own counters: the answering worker's, not summed
    assert metric(text, "toposerve_upstream_up") == 1.0
    assert metric(text, "toposerve_engine_prefix_cache_hits_total") == 100.0
    assert metric(text, "toposerve_workers") == 3.0
    assert metric(text, "toposerve_workers_scraped") == 2.0


def test_listeners_share_one_port_chosen_by_the_first() -> None:
    socks = listeners("127.0.0.1", 0, 3)
    try:
        ports = {s.getsockname()[1] for s in socks}
        assert len(ports) == 1
        # a process without SO_REUSEPORT cannot take the port from under them
        other = socket.socket()
        try:
            other.bind(("127.0.0.1", ports.pop()))
        except OSError:
            pass
        else:
            raise AssertionError("the port was free to a plain bind")
        finally:
            other.close()
    finally:
        for s in socks:
            s.close()


# -- the processes ---------------------------------------------------------------------------------

def test_two_workers_share_the_port_and_each_scrape_counts_every_request(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--workers", "2")
    assert wait_for(lambda: len(children(p.pid)) == 2)
    workers = children(p.pid)
    # Connections are spread over both: raw sockets, each held by exactly one worker.
    held: dict[int, int] = {w: 0 for w in workers}
    socks = [connect(p.url) for _ in range(24)]
    try:
        for sock in socks:
            assert wait_for(functools.partial(held_by_one, workers, sock))
            for w in workers:
                held[w] += holds_connection(w, sock)
    finally:
        for sock in socks:
            sock.close()
    assert sum(held.values()) == 24, held
    assert all(held.values()), held
    body = {"prompt": "hi", "max_tokens": 2, "stream": True}
    for _ in range(30):
        assert post_json(p.url, "/v1/completions", body).status == 200
    for _ in range(6):  # new connections: any worker answers, each answer counts all 30
        text = metrics_text(p.url)
        assert metric(text, "toposerve_requests_total", route="/v1/completions",
                      status="200") == 30.0, text
        assert metric(text, "toposerve_workers_scraped") == 2.0
        assert metric(text, "toposerve_ttft_seconds_count", route="/v1/completions") == 30.0


def test_a_worker_that_dies_stops_the_others_and_the_parent_exits_1(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--workers", "2")
    assert wait_for(lambda: len(children(p.pid)) == 2)
    first, second = children(p.pid)
    os.kill(first, signal.SIGKILL)
    assert wait_for(lambda: not alive(p.pid) and not alive(second), timeout=30)
    assert "ended with status -9: stopping the other workers" in p.log()


def test_sigterm_to_the_parent_drains_and_ends_every_worker(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--workers", "2", "--drain-timeout", "5")
    assert wait_for(lambda: len(children(p.pid)) == 2)
    workers = children(p.pid)
    started = time.monotonic()
    os.kill(p.pid, signal.SIGTERM)
    assert wait_for(lambda: not alive(p.pid) and not any(alive(w) for w in workers),
                    timeout=30)
    assert time.monotonic() - started < 20
    assert "Traceback" not in p.log()


def test_a_killed_parent_takes_its_workers_with_it(spawn_proxy: SpawnProxy,
                                                   sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--workers", "2")
    assert wait_for(lambda: len(children(p.pid)) == 2)
    workers = children(p.pid)
    os.kill(p.pid, signal.SIGKILL)
    assert wait_for(lambda: not any(alive(w) for w in workers), timeout=30)
