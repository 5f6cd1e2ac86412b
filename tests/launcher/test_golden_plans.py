"""The plans `launcher plan --json` prints are the recorded ones (tests/fixtures/golden/, written
by tests/launcher/golden.py): a change of the launcher's insides keeps every plan, its reasons,
candidates and command, unless the change means to (and then the files are re-recorded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launcher.golden import (
    dump,
    golden_file,
    models,
    record_for,
    topologies,
)


def test_every_fixture_pair_has_a_golden_file() -> None:
    missing = [str(golden_file(t, m)) for t in topologies() for m in models()
               if not golden_file(t, m).is_file()]
    assert not missing, f"record them: python -m tests.launcher.golden ({missing[:3]})"


@pytest.mark.parametrize("topology", topologies(), ids=lambda p: p.name)
def test_plans_are_the_recorded_ones(topology: Path) -> None:
    for model in models():
        expected = golden_file(topology, model).read_text()
        actual = dump(record_for(topology, model))
        assert actual == expected, f"{topology.name} x {model.name} differs from its golden file"
