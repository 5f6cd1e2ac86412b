"""Reading vLLM's refusal of a context its KV cache cannot hold."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from launcher.engine.kvrefusal import MIN_RETRY, Refusal, refusal
from tests.launcher.paths import REPO

# The line vLLM 0.26 wrote on the lent H200 (Gemma 3 27B shape at 0.48, kept with the results)
H200_LOG = REPO / "benchmarks/gpu/results/2026-12-01-h200-issue14/sliding-refused/logs"


def v1_message(asked: int, need: float, have: float, est: int) -> str:
    # the text of vllm/v1/core/kv_cache_utils.py _check_enough_kv_cache_memory (0.32)
    est_msg = (
        f"Based on the available memory, the estimated maximum model length is {est}. "
        if est > 0
        else ""
    )
    return (
        f"ValueError: To serve at least one request with the model's max seq len ({asked}), "
        f"({need:.2f} GiB KV cache is needed, which is larger than the available KV cache "
        f"memory ({have:.2f} GiB). {est_msg}Try increasing `gpu_memory_utilization` (which also "
        "controls CPU memory on the CPU backend) or decreasing `max_model_len` when "
        "initializing the engine. See https://docs.vllm.ai/en/latest/configuration/"
        "conserving_memory/ for more details."
    )


def test_reads_the_refusal_vllm_wrote_on_the_h200() -> None:
    text = "\n".join(p.read_text() for p in sorted(H200_LOG.glob("vllm-*.log")))
    r = refusal(text)
    assert r == Refusal(asked=131072, fits=111456, need_gib=17.98, have_gib=16.48)
    assert r.retry_len == 111456
    assert "--max-model-len 111456" in r.explain()


def test_a_log_without_a_refusal_is_none() -> None:
    assert refusal("INFO GPU KV cache size: 912,095 tokens\nApplication startup complete.") is None


def test_the_v0_wording_is_read_too() -> None:
    text = (
        "ValueError: The model's max seq len (32768) is larger than the maximum number of "
        "tokens that can be stored in KV cache (21040). Try increasing `gpu_memory_utilization` "
        "or decreasing `max_model_len` when initializing the engine."
    )
    assert refusal(text) == Refusal(32768, 21040)


def test_no_estimate_means_no_retry_and_says_what_to_do() -> None:
    r = refusal(v1_message(8192, 1.0, 0.01, 0))
    assert r is not None
    assert r.retry_len is None
    assert "lower --max-model-len" in r.explain()


@given(
    asked=st.integers(1, 10_000_000),
    est=st.integers(0, 10_000_000),
    need=st.floats(0.01, 1e4),
    have=st.floats(-10, 1e4),
    noise=st.text(max_size=200),
    prefix=st.sampled_from(["", "(EngineCore pid=900) ERROR 12-01 08:54:10 [core.py:1330] "]),
)
def test_generated_refusals_round_trip(
    asked: int, est: int, need: float, have: float, noise: str, prefix: str
) -> None:
    text = noise + "\n" + prefix + v1_message(asked, need, have, est) + "\n" + noise
    r = refusal(text)
    assert r is not None
    assert (r.asked, r.fits) == (asked, est)
    assert r.retry_len == (est if MIN_RETRY <= est < asked else None)


@given(st.text(max_size=500))
def test_arbitrary_text_never_raises(text: str) -> None:
    r = refusal(text)
    assert r is None or r.asked >= 0


def test_the_failure_line_names_the_length_that_fits() -> None:
    r = Refusal(asked=131072, fits=111456, need_gib=17.98, have_gib=16.48)
    assert r.failure() == (
        "vLLM cannot hold a 131072-token context (17.98 GiB of KV cache needed, 16.48 GiB "
        "available); pass --max-model-len 111456 or less, raise --gpu-memory-utilization or "
        "use more GPUs"
    )


@given(need=st.from_regex(r"-?[0-9.]{1,6}", fullmatch=True),
       have=st.from_regex(r"-?[0-9.]{1,6}", fullmatch=True))
def test_the_refusal_with_numbers_of_any_shape_never_raises(need: str, have: str) -> None:
    # "[0-9.]+" once took "." and "1.2.3" for numbers, and float() raised
    text = (f"To serve at least one request with the model's max seq len (4096), ({need} GiB KV "
            f"cache is needed, which is larger than the available KV cache memory ({have} GiB).")
    r = refusal(text)
    assert r is None or (r.need_gib is not None and r.have_gib is not None)
