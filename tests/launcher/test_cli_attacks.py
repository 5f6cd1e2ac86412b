"""What a new user (or a careless script) types wrong on the command line, and what the commands
say back: one line that says what to do, before anything is started, never a traceback or a
silent change of what was asked."""

from __future__ import annotations

import pytest

from launcher.cli.main import main
from launcher.errors import PlanError
from launcher.model.modelspec import load_model_spec
from launcher.planner.plan import Policy, plan
from launcher.probe.topology import Topology


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [
        ("--tp", "3", "TP=3: 4 attention heads are not divisible by 3"),
        ("--pp", "5", "PP=5: more stages than the 4 layers"),
    ],
)
def test_a_split_the_cpu_engine_cannot_run_is_refused_in_words(
    capsys: pytest.CaptureFixture[str], tiny_model_path: str, flag: str, value: str, why: str
) -> None:
    code = main(["plan", "--model", tiny_model_path, flag, value])  # no GPU here: the CPU engine
    err = capsys.readouterr().err
    assert code == 3
    assert why in err
    assert "Rejection(" not in err  # the reason, not the record it is made from
    assert err.count("\n") == 1


def test_the_cpu_planner_refuses_a_split_with_the_rejections_reason(tiny_model_path: str) -> None:
    with pytest.raises(PlanError, match=r"^TP=3: 4 attention heads are not divisible by 3; "):
        plan(Topology(gpus=()), load_model_spec(tiny_model_path), Policy(force_tp=3))

