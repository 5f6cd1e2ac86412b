"""The LeaderWorkerSets tell every node its own address and the interface for NCCL and Gloo (Ray's
workers, and so vLLM's, inherit the node's environment; vLLM's own executor reads them directly),
and the commands they run plan what they should on one node's GPUs."""

from __future__ import annotations

import shlex

import pytest

from launcher.cli.main import main
from tests.deploy.test_k8s import GROUPS, LWS_ENV, container_of, script_words
from tests.launcher.paths import MODELS, TOPOLOGIES

ROLES = ["leaderTemplate", "workerTemplate"]
FOUR_GPUS = str(TOPOLOGIES / "4xh200-nvswitch.nvml.json")


@pytest.mark.parametrize("directory", GROUPS)
@pytest.mark.parametrize("role", ROLES)
def test_every_node_gets_its_pod_address_and_the_pod_interface(role: str, directory: str) -> None:
    env = {e["name"]: e for e in container_of(role, directory)["env"]}
    assert env["VLLM_HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["NCCL_SOCKET_IFNAME"]["value"] == env["GLOO_SOCKET_IFNAME"]["value"] == "eth0"


@pytest.mark.parametrize("role", ROLES)
def test_ray_starts_on_the_address_vllm_is_told(role: str) -> None:
    script = container_of(role, "multi-node-ray")["args"][0].replace("\\\n", " ")
    start = next(ln for ln in script.splitlines() if "ray start" in ln)
    assert "--node-ip-address=${VLLM_HOST_IP}" in shlex.split(start)


def engine_line(out: str) -> list[str]:
    (engine,) = [ln for ln in out.splitlines() if ln.strip().startswith("engine:")]
    return shlex.split(engine)


def dry_run(words: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    code = main([*words[2:], "--dry-run", "--port", "0", "--topology", FOUR_GPUS])
    out = capsys.readouterr()
    assert code == 0, out.err
    return engine_line(out.out)


def test_the_ray_leaders_serve_command_plans_on_one_node_of_the_group(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {"MODEL": str(MODELS / "llama-3.3-70b"), "GPUS_PER_NODE": "4", "LWS_GROUP_SIZE": "2"}
    argv = dry_run(script_words(container_of("leaderTemplate", "multi-node-ray"), env), capsys)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert "RAY_ADDRESS=127.0.0.1:6379" in argv


@pytest.mark.parametrize(("role", "index"), [("leaderTemplate", "0"), ("workerTemplate", "1")])
def test_each_pod_runs_its_share_of_the_same_split_on_vllms_own_executor(
    role: str, index: str, capsys: pytest.CaptureFixture[str],
) -> None:
    env = {"MODEL": str(MODELS / "llama-3.3-70b"), "GPUS_PER_NODE": "4", **LWS_ENV,
           "LWS_WORKER_INDEX": index}
    argv = dry_run(script_words(container_of(role), env), capsys)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--node-rank") + 1] == index
    assert argv[argv.index("--master-addr") + 1] == LWS_ENV["LWS_LEADER_ADDRESS"]
    assert ("--headless" in argv) == (index != "0")
    assert "--distributed-executor-backend" not in argv
    assert not any(w.startswith("RAY_ADDRESS=") for w in argv)
