"""benchmarks/gpu/prompt_profile.py's summary of a profiler trace: what the next GPU session reads
to split a prompt step's device span into kernels and gaps (issue 22)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[2]


PROFILE = load_script("benchmarks/gpu/prompt_profile.py", "prompt_profile_benchmark")


def kernel(name: str, ts_us: float, dur_us: float, cat: str = "kernel") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts_us, "dur": dur_us}


def test_gaps_between_kernels_are_counted_and_overlaps_are_not_busy_twice() -> None:
    events = [
        kernel("gemm", 0, 100),
        kernel("gemm", 50, 100),  # overlaps the first (another stream): busy 0-150
        kernel("cpu_op", 0, 10_000, cat="cpu_op"),  # host work is not device time
        kernel("norm", 160, 10),  # a 10 us gap: under GAP_S, not a gap
        kernel("attn", 270, 30),  # a 100 us gap
    ]
    s = PROFILE.summarize(events)
    assert s["kernels"] == 4
    assert abs(s["span_s"] - 300e-6) < 1e-12
    assert abs(s["busy_s"] - 190e-6) < 1e-12
    assert s["gaps"] == 1
    assert abs(s["gap_s"] - 100e-6) < 1e-12
    top = s["by_name"][0]
    assert (top["name"], top["count"]) == ("gemm", 2)
    assert abs(top["total_s"] - 200e-6) < 1e-12


def test_the_span_runs_to_the_latest_end_where_a_later_kernel_ends_first() -> None:
    # a long kernel on one stream, a short one started later on another
    s = PROFILE.summarize([kernel("gemm", 0, 100), kernel("norm", 10, 10)])
    assert abs(s["span_s"] - 100e-6) < 1e-12
    assert abs(s["busy_s"] - 100e-6) < 1e-12


def test_a_trace_without_device_kernels_says_so() -> None:
    s = PROFILE.summarize([kernel("aten::mm", 0, 50, cat="cpu_op"), {"ph": "M"}])
    assert s["kernels"] == 0
    assert "no device kernels" in s["note"]


event = st.fixed_dictionaries({
    "ph": st.sampled_from(["X", "X", "B", "i"]),
    "cat": st.sampled_from(["kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "cuda_runtime"]),
    "name": st.text(max_size=8),
    # small integers too, so that kernels overlap often (streams side by side)
    "ts": st.one_of(st.integers(0, 50), st.floats(0, 1e6), st.integers(0, 10**6), st.none(),
                    st.text(max_size=2)),
    "dur": st.one_of(st.integers(0, 50), st.floats(-5, 1e4), st.integers(0, 10**4), st.none()),
})


@given(st.lists(event, max_size=40))
def test_any_trace_summarises_with_busy_and_gaps_within_the_span(
        events: list[dict[str, Any]]) -> None:
    s = PROFILE.summarize(events)
    assert 0.0 <= s["busy_s"] <= s["span_s"] * (1 + 1e-9) + 1e-12
    assert s["busy_s"] + s["gap_s"] <= s["span_s"] * (1 + 1e-9) + 1e-12
    assert sum(k["count"] for k in s["by_name"]) <= s["kernels"]
