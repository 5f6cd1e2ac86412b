"""plan, serve and tune take the same planning options and turn them into the same Policy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.cli import build_parser
from launcher.planopts import policy_from_args
from launcher.plantypes import Policy
from tests.conftest import TOPOLOGIES

OPTIONS = ("--model", "m", "--topology", str(TOPOLOGIES / "h200x2-nvlink.nvml.json"),
           "--workload", "throughput", "--concurrency", "4", "--max-model-len", "8192",
           "--prompt", "2048", "--gen", "64", "--gpu-memory-utilization", "0.8", "--tp", "2",
           "--pp", "2", "--nodes", "2", "--gpus-per-node", "2", "--network-gbps", "25")


def policy_of(command: str, *args: str) -> Policy:
    return policy_from_args(build_parser().parse_args([command, *args]))


@pytest.mark.parametrize("command", ["serve", "tune"])
def test_serve_and_tune_accept_every_plan_option(command: str) -> None:
    assert policy_of(command, *OPTIONS) == policy_of("plan", *OPTIONS)


def test_tune_accepts_plan_options() -> None:
    p = policy_of("tune", *OPTIONS)
    assert (p.prompt_tokens, p.gen_tokens, p.nodes, p.gpus_per_node) == (2048, 64, 2, 2)
    assert (p.force_tp, p.force_pp, p.concurrency, p.max_model_len) == (2, 2, 4, 8192)
    assert p.internode_gbs == policy_of("plan", *OPTIONS).internode_gbs


def test_only_tune_defaults_the_concurrency_it_measures_at() -> None:
    plan = policy_of("plan", "--model", "m")
    # tune runs loadgen at this concurrency, so it needs a number where the planner has a rule
    assert policy_of("tune") == replace(plan, concurrency=16)
    assert policy_of("serve") == plan


def test_plan_text_names_the_prompt_length_it_predicted_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from launcher.cli import main
    from tests.launcher.paths import model

    assert main(["plan", "--model", model("llama-3.3-70b"), "--topology",
                 str(TOPOLOGIES / "h200x2-nvlink.nvml.json"), "--prompt", "3072"]) == 0
    assert "tok/s (3072-token prompt)" in capsys.readouterr().out
