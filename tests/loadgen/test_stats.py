"""Percentiles and summaries."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.stats import dist, percentile, summarize
from loadgen.timing import RequestResult


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=200), st.floats(0, 100))
def test_percentile_matches_numpy_linear(values: list[float], q: float) -> None:
    assert percentile(sorted(values), q) == pytest.approx(np.percentile(values, q), abs=1e-6)


def test_dist_of_nothing_is_all_none() -> None:
    d = dist([])
    assert (d.n, d.mean, d.p50, d.p99) == (0, None, None, None)


def _result(index: int, error: str | None = None) -> RequestResult:
    return RequestResult(index, 512, 256, 0.1, 2.0, 5120.0, 100.0, (0.01, 0.01), None, error)


def test_summary_excludes_failures_and_counts_reasons() -> None:
    results = [_result(0), _result(1), _result(2, "HTTP 500: boom"), _result(3, "HTTP 500: boom")]
    s = summarize(results, window=(0.0, 4.0))
    assert (s.requests_ok, s.requests_failed) == (2, 2)
    assert s.failures == {"HTTP 500: boom": 2}
    assert s.ttft_s.n == 2
    assert s.output_tok_s == pytest.approx(2 * 256 / 4.0)
    assert s.total_tok_s == pytest.approx(2 * (512 + 256) / 4.0)
