"""The CI version of benchmarks/soak.py: 20 s of mixed load with client cancellations; nothing
may fail, and the proxy's memory and descriptors must stay flat."""

from __future__ import annotations

from types import ModuleType

from tests.support.scripts import load_script


def load_soak() -> ModuleType:
    return load_script("benchmarks/soak.py", "soak_benchmark")


def test_short_soak_serves_everything_and_stays_flat() -> None:
    soak = load_soak()
    report = soak.run(duration_s=20.0, concurrency=16, window_s=5.0, ttft=0.05, itl=0.02,
                      tokens=32)
    print(soak.format_report(report))
    assert report.requests > 300
    assert report.cancelled > 0
    assert report.errors == {}
    assert report.rss_last_mib - report.rss_first_mib < 8
    assert report.fds_last - report.fds_first <= 4
    # A leak or a queue building up raises every request's latency and lowers what a window
    # serves; generous, as the cores are shared. Not the p99 of a 5 s window (~120 requests):
    # one stall of this shared VM moves it alone (a clean clone on 2026-12-03 saw 0.68 -> 1.58 s
    # with every window serving 111-129 requests; its CPUs run at two speeds, docs/planner.md).
    assert report.p50_last_s < 1.5 * report.p50_first_s
    first, last = report.windows[0]["requests"], report.windows[-1]["requests"]
    assert isinstance(first, int)
    assert isinstance(last, int)
    assert last > first / 2
