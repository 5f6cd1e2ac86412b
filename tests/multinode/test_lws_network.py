"""The LeaderWorkerSet tells every node its own address and the interface for NCCL and Gloo,
before Ray starts there (Ray's workers, and so vLLM's, inherit the node's environment)."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from launcher.cli.main import main
from tests.deploy.test_k8s import lws
from tests.launcher.paths import MODELS, TOPOLOGIES


def container(role: str) -> dict[str, Any]:
    (c,) = lws()["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"]
    return c


@pytest.mark.parametrize("role", ["leaderTemplate", "workerTemplate"])
def test_every_node_gets_its_pod_address_and_the_pod_interface(role: str) -> None:
    env = {e["name"]: e for e in container(role)["env"]}
    assert env["VLLM_HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["NCCL_SOCKET_IFNAME"]["value"] == env["GLOO_SOCKET_IFNAME"]["value"] == "eth0"


@pytest.mark.parametrize("role", ["leaderTemplate", "workerTemplate"])
def test_ray_starts_on_the_address_vllm_is_told(role: str) -> None:
    script = container(role)["args"][0].replace("\\\n", " ")
    start = next(ln for ln in script.splitlines() if "ray start" in ln)
    assert "--node-ip-address=${VLLM_HOST_IP}" in shlex.split(start)


def test_the_leaders_serve_command_plans_on_one_node_of_the_group(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the leader's exact options, on a 4-GPU node's topology and a 70B model's config
    script = container("leaderTemplate")["args"][0]
    serve = script[script.index("exec launcher serve"):].replace("\\\n", " ")
    env = {"MODEL": str(MODELS / "llama-3.3-70b"), "GPUS_PER_NODE": "4", "LWS_GROUP_SIZE": "2"}
    words = [w.replace("${", "{").format(**env) for w in shlex.split(serve)]
    code = main([*words[2:], "--dry-run", "--port", "0",
                 "--topology", str(TOPOLOGIES / "4xh200-nvswitch.nvml.json")])
    out = capsys.readouterr()
    assert code == 0, out.err
    (engine,) = [ln for ln in out.out.splitlines() if ln.strip().startswith("engine:")]
    argv = shlex.split(engine)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert "RAY_ADDRESS=127.0.0.1:6379" in argv
