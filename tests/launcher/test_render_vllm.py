"""The rendered command line parses with the installed vLLM's own `vllm serve` parser."""

from __future__ import annotations

import pytest

from launcher.engine.render import render
from launcher.model.modelspec import load_model_spec
from launcher.planner.plan import Policy, plan
from launcher.probe.topology import Topology, load_topology
from tests.launcher.paths import H200, model, topo

CASES = [
    (topo("2x3090-pcie-x8x8-nop2p"), "llama-3.3-70b-awq", Policy(), (2, 1, 1, True, "llama3_json")),
    (
        topo("4x4090-2socket"),
        "mistral-7b",
        Policy(workload="throughput", concurrency=64),
        (2, 1, 1, True, "mistral"),  # dp=2 runs as two servers, not --data-parallel-size
    ),
    (str(H200), "qwen3-32b", Policy(nodes=2), (2, 2, 1, False, "hermes")),
    (None, "gemma-3-27b", Policy(), (1, 1, 1, False, None)),
]


@pytest.fixture(scope="module")
def vllm_parser() -> object:
    pytest.importorskip("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())  # type: ignore[no-untyped-call]


@pytest.mark.parametrize(("node", "model_name", "policy", "want"), CASES)
def test_rendered_flags_exist_in_vllm(
    vllm_parser: object, node: str | None, model_name: str, policy: Policy, want: tuple[object, ...]
) -> None:
    t = load_topology(node, {}) if node else Topology(gpus=())
    p = plan(t, load_model_spec(model(model_name)), policy)
    r = render(p, model(model_name), served_name="m", host="127.0.0.1", port=8000)
    ns = vllm_parser.parse_args(list(r.argv[3:]))  # type: ignore[attr-defined]
    got = (
        ns.tensor_parallel_size,
        ns.pipeline_parallel_size,
        ns.data_parallel_size,
        ns.disable_custom_all_reduce,
        ns.tool_call_parser,
    )
    assert got == want
    assert ns.max_model_len == p.max_model_len
    assert ns.enable_prefix_caching is True
    assert ns.enable_chunked_prefill is True
    assert len(r.engines) == p.dp
    for e in r.engines:  # every replica's command parses the same way
        assert vllm_parser.parse_args(list(e.argv()[3:])).port == e.port  # type: ignore[attr-defined]
