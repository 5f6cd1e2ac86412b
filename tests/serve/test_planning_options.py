"""plan, serve and tune take the same planning options and turn them into the same Policy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.cli.main import build_parser
from launcher.cli.planopts import policy_from_args
from launcher.planner.plantypes import Policy
from tests.conftest import TOPOLOGIES
from tests.launcher.paths import MODELS

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
    from launcher.cli.main import main
    from tests.launcher.paths import model

    assert main(["plan", "--model", model("llama-3.3-70b"), "--topology",
                 str(TOPOLOGIES / "h200x2-nvlink.nvml.json"), "--prompt", "3072"]) == 0
    assert "tok/s (3072-token prompt)" in capsys.readouterr().out


@pytest.mark.parametrize(("value", "gib"), [("4", 4.0), (" 2 ", 2.0), ("", None)])
def test_the_cpu_plan_sizes_the_kv_cache_the_engine_will_really_get(
        value: str, gib: float | None) -> None:
    from launcher.cli.planopts import cpu_kv_cache_gib

    # None: no size of the user's, so the plan sizes the cache and render gives it
    assert cpu_kv_cache_gib({"VLLM_CPU_KVCACHE_SPACE": value}) == gib


@pytest.mark.parametrize("value", ["0.5", "1.5", "lots", "0", "-3", "inf", "nan", "2GiB"])
def test_a_cpu_kv_space_the_engine_cannot_read_is_refused_in_one_line(value: str) -> None:
    from launcher.cli.planopts import cpu_kv_cache_gib
    from launcher.errors import PlanError

    # vLLM's CPU platform reads it with int(): the engine would stop at its start
    with pytest.raises(PlanError, match="whole number of GiB") as err:
        cpu_kv_cache_gib({"VLLM_CPU_KVCACHE_SPACE": value})
    assert "\n" not in str(err.value)


def test_without_the_variable_the_plan_sizes_the_cache_and_render_gives_the_engine_that_one(
) -> None:
    from launcher.cli.planopts import cpu_kv_cache_gib
    from launcher.engine.render import EngineOptions, engine_command
    from launcher.model.modelspec import load_model_spec
    from launcher.planner.plan import plan
    from launcher.planner.plantypes import CPU_KV_ENV, Policy
    from launcher.probe.topology import Topology

    assert cpu_kv_cache_gib({}) is None is Policy().cpu_kv_cache_gib
    p = plan(Topology(gpus=()), load_model_spec(str(MODELS / "gemma-4-31b")), Policy())
    assert p.env[CPU_KV_ENV] == "3"  # 1 GiB holds 1,024 of its tokens, 3 the 4,096 wanted
    assert engine_command(p, "m", EngineOptions(), {}).env[CPU_KV_ENV] == "3"
