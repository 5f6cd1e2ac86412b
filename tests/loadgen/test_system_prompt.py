"""The agent workload's shared system prompt: `loadgen --system-tokens N|off` and the plan's
`--system-tokens` of the same meaning (issue 24), read from generated texts; the conversations
loadgen builds with it, and the plan's simulation taking the same figure."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli import agentopts
from launcher.cli.planopts import add_planning_arguments
from launcher.errors import PlanError
from launcher.model.modelspec import load_model_spec
from launcher.model.tinymodel import ensure_tiny_model
from launcher.planner import agent
from launcher.planner.plantypes import Policy
from loadgen.agent import build_conversations, parse_system_tokens
from loadgen.cli import build_parser, config_from
from loadgen.config import Config
from loadgen.errors import BadArgument
from tests.launcher.test_agent_turns import WordCounter, timed_cpu

SCALE = {"": 1, "k": 1000, "m": 10**6, "K": 1024, "M": 2**20}
COUNT = st.tuples(st.integers(0, 99_999), st.sampled_from(sorted(SCALE)))
OFF = st.sampled_from(["off", "OFF", " none ", "None", "0"])


@given(COUNT, st.booleans())
@settings(max_examples=300)
def test_a_token_count_reads_the_same_in_loadgen_and_in_the_plan(
    count: tuple[int, str], pad: bool
) -> None:
    number, suffix = count
    text = f" {number}{suffix} " if pad else f"{number}{suffix}"
    assert parse_system_tokens(text) == number * SCALE[suffix]
    if number * SCALE[suffix] <= agentopts.MAX_TOKENS:
        assert agentopts.system_tokens(text) == number * SCALE[suffix]


@given(OFF)
def test_off_none_and_zero_mean_no_system_prompt_in_both(text: str) -> None:
    assert parse_system_tokens(text) == 0
    assert agentopts.system_tokens(text) == 0


@given(st.text(max_size=12))
@settings(max_examples=400)
def test_any_text_is_a_count_or_refused_in_one_line(text: str) -> None:
    for parse, error in ((parse_system_tokens, BadArgument),
                         (agentopts.system_tokens, argparse.ArgumentTypeError)):
        message, value = "", 0
        try:
            value = parse(text)
        except error as exc:
            message = str(exc)
        assert "\n" not in message
        assert value >= 0


def loadgen_config(*argv: str) -> Config:
    return config_from(build_parser().parse_args(["--url", "http://127.0.0.1:9", *argv]))


def test_loadgen_takes_the_flag_only_for_the_agent_workload_and_below_turn_one() -> None:
    assert loadgen_config("--workload", "agent").system_tokens is None  # a quarter of turn 1
    assert loadgen_config("--workload", "agent", "--system-tokens", "off").system_tokens == 0
    assert loadgen_config("--workload", "agent", "--system-tokens", "1.5k").system_tokens == 1500
    with pytest.raises(BadArgument, match="add --workload agent"):
        loadgen_config("--system-tokens", "500")
    with pytest.raises(BadArgument, match="below turn 1"):
        loadgen_config("--workload", "agent", "--context", "2000:8000", "--system-tokens", "2k")
    with pytest.raises(BadArgument, match="--system-tokens: a token count"):
        loadgen_config("--workload", "agent", "--system-tokens", "lots")


@pytest.mark.parametrize("system", [None, 0, 300])
def test_the_sessions_share_exactly_the_system_prompt_asked_for(system: int | None) -> None:
    """With a tokenizer of one token a word: the tokens every session's first turn has in common
    (BOS, then the system message) are the planner's loadgen_common_tokens of the same setting;
    with none, the first message is already the session's own."""
    first = 2000
    cfg = Config(workload="agent", chat=True, sessions=3, turns=2, gen=64, seed=3,
                 system_tokens=system)
    convs, counts = build_conversations(WordCounter(), cfg, (first, 6000))
    assert all(row[0] == first for row in counts)
    openings = [c[0][0] for c in convs]
    if system == 0:
        assert all(o["role"] == "user" for o in openings)
        assert len({o["content"] for o in openings}) == 3
        return
    assert all(o == openings[0] and o["role"] == "system" for o in openings)
    common = 4 + len(openings[0]["content"].split())  # its header and its words
    assert common == agent.loadgen_common_tokens(first, system)
    with pytest.raises(BadArgument, match="not below turn 1"):
        build_conversations(WordCounter(), replace(cfg, system_tokens=first), (first, 6000))


def plan_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_planning_arguments(p, model_help="")
    return p.parse_args([*argv] if "--workload" in argv else
                        ["--workload", "agent", "--context", "3000", *argv])


def test_the_plans_flag_is_the_simulations_shared_prefix() -> None:
    assert agentopts.agent_ask(plan_args()).common_tokens == 0  # none assumed by default
    ask = agentopts.agent_ask(plan_args("--system-tokens", "1k", "--sessions", "3"))
    assert ask is not None
    assert ask.common_tokens == 1000
    with pytest.raises(PlanError, match="--system-tokens"):
        agentopts.agent_ask(plan_args("--system-tokens", "8k"))
    with pytest.raises(PlanError, match="add --workload agent"):
        agentopts.agent_ask(plan_args("--workload", "interactive", "--system-tokens", "100"))
    # the simulated sessions' first turns find it cached once one session sent it
    m = load_model_spec(str(ensure_tiny_model()))
    shared = agent.cpu_agent_plan(m, Policy(cpu_cores=os.cpu_count() or 1), ask, timed_cpu(m))
    alone = agent.cpu_agent_plan(m, Policy(cpu_cores=os.cpu_count() or 1),
                                 replace(ask, common_tokens=0), timed_cpu(m))
    def first_turn(p: agent.AgentPlan) -> str:
        line = next(r for r in p.reasons if "TTFT p50 by depth: " in r)
        return line.split("TTFT p50 by depth: ")[1].split(";")[0]

    assert "(0% cached)" not in first_turn(shared), shared.reasons
    assert "(0% cached)" in first_turn(alone), alone.reasons
