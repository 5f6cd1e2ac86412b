"""Each `launcher tune` candidate is one typed request through the same pipeline as plan and
serve: its layout and flags, tune's load, and the agent workload asked for."""

from __future__ import annotations

import os

from launcher.cli.cmd_tune import candidate_request, tuned_plan_json
from launcher.cli.main import build_parser
from launcher.pipeline.run import plan_and_render
from launcher.tune.loop import parse_candidate
from tests.conftest import REPO

TINY = str(REPO / "tests" / "fixtures" / "models" / "llama-3.2-3b")
CPU_ONLY = str(REPO / "tests" / "fixtures" / "golden" / "cpu-only.toposerve.json")


def test_a_candidates_own_flags_size_its_plan_and_come_before_the_shared_ones() -> None:
    args = build_parser().parse_args(["tune", "--model", TINY, "--topology", CPU_ONLY,
                                      "--objective", "throughput", "--", "--enforce-eager"])
    request = candidate_request(args, parse_candidate("name=fp8 --kv-cache-dtype fp8"), ("k",))
    assert request.plan.engine.extra_args == ("--kv-cache-dtype", "fp8", "--enforce-eager")
    assert request.plan.policy.kv_cache_bytes == 1  # sized with the FP8 cache it will get
    assert request.plan.policy.workload == "throughput"
    assert request.plan.policy.concurrency == 16  # tune's load: --concurrency (default 16)
    assert request.plan.engine.port is None  # a free one, on loopback
    assert request.api_keys == ("k",)


def test_an_agent_workload_reaches_every_candidate_and_the_plan_tune_writes() -> None:
    # was: tune dropped --workload agent for each candidate and refused its --sessions/--context
    args = build_parser().parse_args(["tune", "--model", TINY, "--topology", CPU_ONLY,
                                      "--workload", "agent", "--objective", "interactive",
                                      "--sessions", "2", "--context", "2k"])
    request = candidate_request(args, parse_candidate("name=default"), ())
    assert request.plan.agent is not None
    assert (request.plan.agent.sessions, request.plan.agent.context) == (2, 2000)
    planned = plan_and_render(request.plan, os.environ)
    assert planned.agent is not None
    written = tuned_plan_json(planned)
    assert written["agent"]["sessions"] == 2
    assert written["argv"] == list(planned.rendered.argv)  # the command measured, rendered once
