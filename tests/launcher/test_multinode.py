"""`launcher plan --nodes N --gpus-per-node G`: TP inside a node, PP across nodes."""

from __future__ import annotations

import json

import pytest

from launcher.cli.main import main
from launcher.engine.render import render
from launcher.errors import PlanError
from launcher.model.modelspec import load_model_spec
from launcher.planner.plan import Policy, plan
from launcher.probe.topology import Topology, load_topology
from tests.launcher.paths import H200, model, topo

CASES = [
    # node topology, model, nodes, GPUs per node, expected (tp, pp)
    (str(H200), "llama-3.3-70b", 2, 2, (2, 2)),
    (topo("4x4090-2socket"), "llama-3.3-70b", 2, 4, (4, 2)),
    (topo("4x4090-2socket"), "llama-3.3-70b-awq", 2, 2, (2, 2)),
    (topo("8xh100-nvswitch"), "llama-3.3-70b", 2, 8, (8, 2)),
    (topo("2x3090-nvlink-x8x8"), "qwen2.5-32b", 2, 2, (2, 2)),
    (topo("2x3090-pcie-x8x8-nop2p"), "gemma-3-27b", 2, 2, (2, 2)),
]


@pytest.mark.parametrize(("node", "model_name", "nodes", "per", "want"), CASES)
def test_tp_stays_inside_a_node_and_pp_spans_the_nodes(
    node: str, model_name: str, nodes: int, per: int, want: tuple[int, int]
) -> None:
    m = load_model_spec(model(model_name))
    p = plan(load_topology(node, {}), m, Policy(nodes=nodes, gpus_per_node=per))
    assert (p.tp, p.pp) == want
    assert p.nodes == nodes
    assert p.tp * p.pp == nodes * per  # every GPU of every node
    assert len(p.gpus) == per  # the GPUs of each node
    for c in p.candidates:
        assert c.tp <= per  # never TP across the network
        assert c.tp * c.pp == nodes * per
    assert p.settings.distributed_backend == "ray"
    r = render(p, m.name, served_name=None, host="0.0.0.0", port=8000)
    assert r.argv[r.argv.index("--pipeline-parallel-size") + 1] == str(p.pp)
    assert "ray" in r.argv


def test_pipeline_over_the_network_costs_little_tensor_parallel_would_cost_much() -> None:
    m = load_model_spec(model("llama-3.3-70b"))
    node = load_topology(str(H200), {})
    fast = plan(node, m, Policy(nodes=2, internode_gbs=50.0))
    slow = plan(node, m, Policy(nodes=2, internode_gbs=1.0))
    # one hop of hidden-size activations per token: the network barely shows in PP
    assert slow.predicted.decode_tok_s / fast.predicted.decode_tok_s > 0.95


def test_a_model_one_node_holds_gets_the_replica_advice() -> None:
    p = plan(load_topology(str(H200), {}), load_model_spec(model("qwen2.5-32b")), Policy(nodes=2))
    assert any("independent replicas" in r for r in p.reasons)


@pytest.mark.parametrize(("node", "model_name"), [(str(H200), "qwen2.5-32b"),
                                                  (topo("4x4090-2socket"), "llama-3.1-8b")])
def test_the_replica_advice_names_the_plan_one_node_gets(node: str, model_name: str) -> None:
    t, m = load_topology(node, {}), load_model_spec(model(model_name))
    one = plan(t, m, Policy(nodes=1))
    [note] = [r for r in plan(t, m, Policy(nodes=2)).reasons if "independent replicas" in r]
    assert f"({one.mode} TP={one.tp} PP={one.pp}, " in note
    assert f"{one.predicted.throughput_tok_s:.0f} tok/s there" in note
    assert f"~{2 * one.predicted.throughput_tok_s:.0f} tok/s together" in note


def test_a_model_no_single_node_holds_is_said_to_need_the_split() -> None:
    p = plan(load_topology(topo("4x4090-2socket"), {}), load_model_spec(model("llama-3.3-70b")),
             Policy(nodes=2))
    assert any("one node cannot hold llama-3.3-70b" in r for r in p.reasons)


def test_nodes_without_gpus_run_one_layer_stage_each_on_the_cpu_engine() -> None:
    p = plan(Topology(gpus=()), load_model_spec(model("mistral-7b")), Policy(nodes=2))
    assert (p.engine, p.tp, p.pp, p.dp) == ("cpu", 1, 2, 1)


def test_more_gpus_per_node_than_the_topology_has_is_an_error() -> None:
    with pytest.raises(PlanError, match="--gpus-per-node 4"):
        plan(
            load_topology(str(H200), {}),
            load_model_spec(model("mistral-7b")),
            Policy(nodes=2, gpus_per_node=4),
        )


def test_cli_multi_node_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan",
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--topology",
            str(H200),
            "--model",
            model("llama-3.3-70b"),
            "--network-gbps",
            "200",
            "--json",
        ]
    )
    d = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (d["tp"], d["pp"], d["nodes"]) == (2, 2, 2)
    assert "--distributed-executor-backend" in d["argv"]
