"""A plan's engine settings are typed fields (EngineSettings), given to vLLM as flags by the
engine command and kept in a plan file in vLLM's words, which read back to the same fields."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.engine.planfile import plan_from_json, plan_to_json, settings_words
from launcher.engine.render import render
from launcher.errors import PlanError
from launcher.model.modelspec import load_model_spec
from launcher.planner.plan import Policy, plan
from launcher.planner.plantypes import BACKENDS, EngineSettings
from launcher.probe.topology import load_topology
from tests.launcher.paths import model, topo

# two 24 GB cards without P2P: TP=2 over SHM, so vLLM's custom all-reduce is turned off
NO_P2P = plan(load_topology(topo("2x3090-pcie-x8x8-nop2p"), {}),
              load_model_spec(model("llama-3.3-70b-awq")), Policy())


def test_a_layout_without_p2p_turns_the_custom_all_reduce_off_in_the_command() -> None:
    assert NO_P2P.settings == EngineSettings(disable_custom_all_reduce=True)
    argv = render(NO_P2P, "m", served_name=None, host="127.0.0.1", port=8000).argv
    assert argv.count("--disable-custom-all-reduce") == 1


@given(st.booleans(), st.sampled_from((None, *BACKENDS)))
def test_any_settings_read_back_from_a_plan_file_as_written(
        no_custom: bool, backend: str | None) -> None:
    settings = EngineSettings(no_custom, backend)  # type: ignore[arg-type]
    p = replace(NO_P2P, settings=settings)
    data = plan_to_json(p, render(p, "m", served_name=None, host="127.0.0.1", port=8000))
    assert data["flags"] == list(settings_words(settings))
    assert plan_from_json(data).settings == settings


@pytest.mark.parametrize("flags", [["--enforce-eager"], ["--distributed-executor-backend", "x"]])
def test_flags_no_plan_sets_are_a_one_line_error_naming_the_place_for_own_flags(
        flags: list[str]) -> None:
    data = plan_to_json(NO_P2P, render(NO_P2P, "m", served_name=None, host="h", port=1))
    data["flags"] = flags
    with pytest.raises(PlanError) as err:
        plan_from_json(data)
    assert "\n" not in str(err.value)
    assert "vllm_extra_args" in str(err.value) or "must be one of" in str(err.value)
