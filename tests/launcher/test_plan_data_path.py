"""A plan's data passes through the planner's modules once, in order (docs/architecture.md, "A
plan's path through the planner"): traced with ``sys.setprofile`` over one `launcher plan` and
one `launcher serve --dry-run` of fixture models on fixture topologies.

- The stages: the planner modules the orchestrators (pipeline/run.py and planner/plan.py) hand
  the data to, in the order they do, are the documented ones, none twice.
- No call-back: no planner module's function is entered again while a call into that module is
  still under way (the old ``explain.no_fit(replan=...)``, ``multinode`` calling ``plan()``);
  the methods of a value handed down (a scheduler simulation's step timer) are its own.
- No recomputation: no memory fit is made twice with the same inputs (the old ``explain`` and
  ``whatif`` fitting every candidate again).
"""

from __future__ import annotations

import contextlib
import io
import socket
import sys
from collections import Counter
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import pytest

from launcher.errors import PlanError
from tests.launcher.golden import pinned_machine
from tests.launcher.paths import model, topo

PLANNER = "launcher.planner."
ORCHESTRATORS = ("launcher.pipeline.run", "launcher.planner.plan")
# values and the table of cards: read anywhere, they hold no stage of the data's path
NOT_STAGES = ("launcher.planner.plantypes", "launcher.planner.hardware")


@dataclass
class Trace:
    stages: list[str] = field(default_factory=list)  # collapsed: one entry per visit
    reentries: list[str] = field(default_factory=list)
    fits: list[tuple[Any, ...]] = field(default_factory=list)
    exit: int = -1


def _module(frame: FrameType | None) -> str:
    return "" if frame is None else str(frame.f_globals.get("__name__", ""))


def traced(argv: list[str]) -> Trace:
    """Runs the launcher's command line on ``argv`` with every Python call watched."""
    # imported before tracing, so that module bodies run now are not counted as calls
    import launcher.engine.render
    import launcher.pipeline.run  # noqa: F401
    from launcher.cli.main import main

    t = Trace()
    # the calls into a planner module from another module still under way, innermost last
    entered: list[tuple[FrameType, str]] = []
    active: Counter[str] = Counter()

    def watch(frame: FrameType, event: str, arg: object) -> None:
        if event == "return":
            if entered and entered[-1][0] is frame:
                active[entered.pop()[1]] -= 1
            return
        if event != "call":
            return
        callee, caller = _module(frame), _module(frame.f_back)
        if not callee.startswith(PLANNER) or callee == caller:
            return
        stage = callee.removeprefix(PLANNER)
        if (caller in ORCHESTRATORS and callee not in NOT_STAGES
                and (not t.stages or t.stages[-1] != stage)):
            t.stages.append(stage)
        # A value handed down with its behaviour (schedsim's StepTimer, a Links table) is called
        # where it was handed: its methods are not a return to the module that made it.
        if active[callee] and "." not in frame.f_code.co_qualname:
            t.reentries.append(f"{caller} -> {callee}.{frame.f_code.co_name}, while "
                               + " -> ".join(m for _, m in entered))
        entered.append((frame, callee))
        active[callee] += 1
        if callee == "launcher.planner.memfit" and frame.f_code.co_name == "fit":
            loc = frame.f_locals
            gpus = tuple(sorted(g.index for g in loc["gpus"]))
            m = loc["m"]
            t.fits.append((m.name, m.weight_bytes, gpus, loc["tp"], loc["pp"], loc["util"],
                           loc["kv_dtype_bytes"], loc["offload"]))

    out = io.StringIO()
    with pinned_machine(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        sys.setprofile(watch)
        try:
            t.exit = main(argv)
        finally:
            sys.setprofile(None)
    return t


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CASES = {
    # one node: the search, the chosen layout's load (simulated), then the explanation
    "plan": (["plan", "--json", "--topology", topo("2x3090-desktop-on-gpu0"),
              "--model", model("llama-3.1-8b"), "--workload", "throughput"],
             ["layouts", "loadsim", "explain"]),
    # serve goes the same way (its --dry-run stops before starting anything)
    "serve": (["serve", "--dry-run", "--topology", topo("2x3090-p2p-x16"),
               "--model", model("mistral-7b")],
              ["layouts", "loadsim", "explain"]),
    # several nodes: one node's search first, then the split over the nodes, then the words
    "nodes": (["plan", "--json", "--topology", topo("2x3090-p2p-x16"),
               "--model", model("llama-3.3-70b-awq"), "--nodes", "2"],
              ["layouts", "multinode", "loadsim", "explain"]),
    # nothing fits: the search, then the explanation, which asks what would fit (no load to
    # simulate)
    "no fit": (["plan", "--json", "--topology", topo("2x3090-gt1030-display"),
                "--model", model("llama-3.3-70b")],
               ["layouts", "explain"]),
}


@pytest.fixture(scope="module")
def traces() -> dict[str, Trace]:
    found = {}
    for name, (argv, _) in CASES.items():
        if argv[0] == "serve":
            argv = [*argv, "--port", str(free_port())]
        found[name] = traced(argv)
    return found


@pytest.mark.parametrize("case", CASES)
def test_a_plans_data_enters_each_planner_stage_once_in_order(
        traces: dict[str, Trace], case: str) -> None:
    t = traces[case]
    assert t.exit == (PlanError.exit_code if case == "no fit" else 0)
    # the policy's KV dtype for this checkpoint first (kvdtype), then the plan's stages
    assert ["kvdtype", "plan", *CASES[case][1]] == t.stages


@pytest.mark.parametrize("case", CASES)
def test_no_planner_module_is_entered_again_from_below_itself(
        traces: dict[str, Trace], case: str) -> None:
    assert traces[case].reentries == []


@pytest.mark.parametrize("case", CASES)
def test_no_memory_fit_is_made_twice(traces: dict[str, Trace], case: str) -> None:
    fits = traces[case].fits
    assert fits, "the trace saw no memory fit: the test would pass on anything"
    again = sorted({f for f in fits if fits.count(f) > 1})
    assert again == []
