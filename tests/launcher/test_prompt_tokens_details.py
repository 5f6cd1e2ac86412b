"""The engine is started with vLLM's prompt-token details on (with its prefix cache), so that
answers carry ``usage.prompt_tokens_details.cached_tokens`` (what the prefix cache served)."""

from __future__ import annotations

import pytest

from launcher.engine.enginecmd import EngineCommand
from launcher.engine.render import render
from launcher.model.modelspec import load_model_spec
from launcher.planner.plan import Policy, plan
from launcher.probe.topology import Topology
from tests.launcher.paths import model


def test_engine_command_asks_for_prompt_token_details_with_the_prefix_cache() -> None:
    argv = EngineCommand(model="m", host="127.0.0.1", port=8001).argv()
    assert argv.count("--enable-prompt-tokens-details") == 1
    off = EngineCommand(model="m", host="127.0.0.1", port=8001, prefix_caching=False)
    assert "--enable-prompt-tokens-details" not in off.argv()


def test_installed_vllm_takes_the_flag_for_every_rendered_engine() -> None:
    pytest.importorskip("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())  # type: ignore[no-untyped-call]
    p = plan(Topology(gpus=()), load_model_spec(model("gemma-3-27b")), Policy())
    r = render(p, model("gemma-3-27b"), served_name="m", host="127.0.0.1", port=8000)
    for engine in r.engines:
        ns = parser.parse_args(list(engine.argv()[3:]))
        assert ns.enable_prompt_tokens_details is True
