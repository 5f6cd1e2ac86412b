"""The LeaderWorkerSet tells every node its own address and the interface for NCCL and Gloo,
before Ray starts there (Ray's workers, and so vLLM's, inherit the node's environment)."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from tests.deploy.test_k8s import lws


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
