"""`launcher serve --plan FILE` with a plan file damaged at any field (missing, null, of another
type, infinite, out of range, GPUs that do not match tp x pp x dp): it serves the plan or ends
in one line saying what is wrong; never a traceback."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.cli.main import main
from tests.conftest import REPO, TOPOLOGIES

H200 = str(TOPOLOGIES / "h200x2-nvlink.nvml.json")
LLAMA70B = str(REPO / "tests" / "fixtures" / "models" / "llama-3.3-70b")


def _saved_plan() -> dict[str, Any]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--topology", H200, "--model", LLAMA70B, "--json"]) == 0
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


PLAN = _saved_plan()
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 1 << 40), st.floats(),
                   st.text(max_size=6), st.lists(st.integers(-1, 9), max_size=4),
                   st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


@st.composite
def damaged_plans(draw: st.DrawFn) -> dict[str, Any]:
    plan = copy.deepcopy(PLAN)
    for _ in range(draw(st.integers(1, 3))):
        where = plan
        if draw(st.booleans()):
            where = plan["predicted"] if isinstance(plan.get("predicted"), dict) else plan
        if not where:
            continue
        key = draw(st.sampled_from(sorted(where)))
        if draw(st.booleans()):
            del where[key]
        else:
            where[key] = draw(VALUES)
    return plan


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=damaged_plans())
def test_a_damaged_plan_file_serves_or_is_one_line(
        plan: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    code = main(["serve", "--plan", str(path), "--model", LLAMA70B, "--dry-run"])
    _, err = capsys.readouterr()
    if code != 0:
        assert len(err.strip().splitlines()) == 1, err


def test_gpus_that_do_not_match_the_split_are_refused(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    plan = {**PLAN, "tp": 4}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    assert main(["serve", "--plan", str(path), "--model", LLAMA70B, "--dry-run"]) != 0
    assert "needs 4 GPUs, and gpus lists 2" in capsys.readouterr().err
