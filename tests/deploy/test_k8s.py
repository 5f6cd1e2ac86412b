"""deploy/k8s/: every manifest against Kubernetes' OpenAPI schemas (kubernetes-validate, offline,
strict: unknown fields fail), the LeaderWorkerSets (vLLM's own multi-node executor in
multi-node/, Ray in multi-node-ray/) structurally with their pod templates validated as
PodTemplates, and the commands in them parsed by bash and by the launcher's own parser.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from launcher.cli.main import build_parser
from tests.deploy.shipped import DEPLOY

K8S = DEPLOY / "k8s"
K8S_VERSION = "1.30.0"  # oldest release still maintained upstream when this was written
MANIFESTS = sorted(K8S.rglob("*.yaml"))
LWS_RESTART_POLICIES = {"RecreateGroupOnPodRestart", "None"}
GROUPS = ("multi-node", "multi-node-ray")
# What LWS (v0.6+) sets in every pod of a group, for a group of two: index 0 is the leader.
LWS_ENV = {"LWS_GROUP_SIZE": "2", "LWS_LEADER_ADDRESS": "toposerve-0.toposerve.default"}


def documents(path: Path) -> Iterator[dict[str, Any]]:
    yield from (d for d in yaml.safe_load_all(path.read_text()) if d)


def all_documents() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in MANIFESTS for doc in documents(path)]


def one(kind: str, directory: str) -> dict[str, Any]:
    found = [d for p, d in all_documents() if d["kind"] == kind and p.parent.name == directory]
    assert len(found) == 1, f"{len(found)} {kind} in {directory}"
    return found[0]


def lws(directory: str = "multi-node") -> dict[str, Any]:
    return one("LeaderWorkerSet", directory)


def container_of(role: str, directory: str = "multi-node") -> dict[str, Any]:
    (container,) = lws(directory)["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"]
    return container


def script_words(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The `launcher serve ...` words of a pod's script, its ${VARS} set from ``env``."""
    script = container["args"][0]
    serve = script[script.index("exec launcher serve"):].replace("\\\n", " ")
    return [w.replace("${", "{").format(**env) for w in shlex.split(serve)]


def pod_templates() -> list[tuple[str, dict[str, Any]]]:
    """(where, PodTemplateSpec) of every workload."""
    deployment = one("Deployment", "single-node")
    out = [("single-node Deployment", deployment["spec"]["template"])]
    for directory in GROUPS:
        template = lws(directory)["spec"]["leaderWorkerTemplate"]
        out += [(f"{directory} leader", template["leaderTemplate"]),
                (f"{directory} worker", template["workerTemplate"])]
    return out


def test_there_are_single_and_multi_node_manifests() -> None:
    kinds = {(p.parent.name, d["kind"]) for p, d in all_documents()}
    assert ("single-node", "Deployment") in kinds
    assert {(g, "LeaderWorkerSet") for g in GROUPS} <= kinds


@pytest.mark.parametrize(
    "doc", [d for _, d in all_documents() if d["kind"] != "LeaderWorkerSet"],
    ids=lambda d: f"{d['kind']}/{d['metadata']['name']}",
)  # fmt: skip
def test_builtin_kinds_pass_the_kubernetes_schema(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("where", "template"), pod_templates(), ids=lambda v: str(v)[:30])
def test_pod_templates_pass_the_kubernetes_schema(where: str, template: dict[str, Any]) -> None:
    wrapped = {"apiVersion": "v1", "kind": "PodTemplate",
               "metadata": {"name": "toposerve"}, "template": template}  # fmt: skip
    kubernetes_validate.validate(wrapped, K8S_VERSION, strict=True)


@pytest.mark.parametrize("directory", GROUPS)
def test_leaderworkerset_has_the_fields_its_controller_requires(directory: str) -> None:
    doc = lws(directory)
    assert doc["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    spec = doc["spec"]
    assert isinstance(spec["replicas"], int)
    assert spec["replicas"] >= 1
    template = spec["leaderWorkerTemplate"]
    assert isinstance(template["size"], int)
    assert template["size"] >= 2, "one node needs no LeaderWorkerSet"
    assert template["restartPolicy"] in LWS_RESTART_POLICIES
    assert set(template) >= {"leaderTemplate", "workerTemplate"}


def gpu_count(container: dict[str, Any]) -> int:
    resources = container["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"]
    return int(resources["limits"]["nvidia.com/gpu"])


def env_value(container: dict[str, Any], name: str) -> str:
    return str(next(e["value"] for e in container["env"] if e["name"] == name))


@pytest.mark.parametrize(("where", "template"), pod_templates(), ids=lambda v: str(v)[:30])
def test_every_container_requests_gpus_and_gets_shared_memory(
    where: str, template: dict[str, Any]
) -> None:
    spec = template["spec"]
    (container,) = spec["containers"]
    assert gpu_count(container) >= 1
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize("directory", GROUPS)
def test_multi_node_plans_with_the_gpus_each_node_has(directory: str) -> None:
    for role in ("leaderTemplate", "workerTemplate"):
        container = container_of(role, directory)
        assert int(env_value(container, "GPUS_PER_NODE")) == gpu_count(container), role


@pytest.mark.parametrize(
    ("where", "container"),
    [("single-node", one("Deployment", "single-node")["spec"]["template"]["spec"]["containers"][0]),
     *((f"{g} leader", container_of("leaderTemplate", g)) for g in GROUPS)],
    ids=["single-node", *GROUPS],
)  # fmt: skip
def test_serving_containers_probe_health_and_ready_on_the_proxy(
    where: str, container: dict[str, Any]
) -> None:
    port = next(p for p in container["ports"] if p["name"] == "http")["containerPort"]
    assert port == 8000
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    for probe in ("livenessProbe", "startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "http"


def test_services_select_the_serving_pods() -> None:
    pairs = [
        (one("Service", "single-node"),
         one("Deployment", "single-node")["spec"]["template"]["metadata"]["labels"]),
        # LWS labels its pods with leaderworkerset.sigs.k8s.io/name=<its name>.
        *((one("Service", g),
           {**lws(g)["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"],
            "leaderworkerset.sigs.k8s.io/name": lws(g)["metadata"]["name"]}) for g in GROUPS),
    ]  # fmt: skip
    for service, labels in pairs:
        selector = service["spec"]["selector"]
        assert selector.items() <= labels.items(), (selector, labels)


def test_claimed_volumes_are_defined_beside_them() -> None:
    for where, template in pod_templates():
        directory = where.split()[0]
        claims = {v["persistentVolumeClaim"]["claimName"] for v in template["spec"]["volumes"]
                  if "persistentVolumeClaim" in v}  # fmt: skip
        defined = {
            d["metadata"]["name"]
            for p, d in all_documents()
            if d["kind"] == "PersistentVolumeClaim" and p.parent.name == directory
        }
        assert claims <= defined, where


def test_single_node_command_is_accepted_by_launcher_serve() -> None:
    (container,) = one("Deployment", "single-node")["spec"]["template"]["spec"]["containers"]
    # The image's entrypoint is `launcher serve` (deploy/docker/Dockerfile).
    entrypoint = docker_entrypoint(DEPLOY / "docker" / "Dockerfile")
    assert entrypoint == ["launcher", "serve"]
    args = build_parser().parse_args([*entrypoint[1:], *container["args"]])
    assert (args.host, args.port) == ("0.0.0.0", 8000)
    # vLLM's own metrics: it listens on the pod address at the port the manifest names "engine"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (args.engine_host, args.engine_port) == ("0.0.0.0", ports["engine"])


def docker_entrypoint(path: Path) -> list[str]:
    line = next(x for x in path.read_text().splitlines() if x.startswith("ENTRYPOINT "))
    words: list[str] = yaml.safe_load(line.removeprefix("ENTRYPOINT "))
    return words


@pytest.mark.parametrize("directory", GROUPS)
@pytest.mark.parametrize("role", ["leaderTemplate", "workerTemplate"])
def test_multi_node_scripts_are_valid_bash(role: str, directory: str) -> None:
    container = container_of(role, directory)
    assert container["command"] == ["/bin/bash", "-c"]
    done = subprocess.run(["bash", "-n", "-c", container["args"][0]], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_ray_leader_serves_on_ray_with_tp_in_a_node_and_pp_across_nodes() -> None:
    container = container_of("leaderTemplate", "multi-node-ray")
    script = container["args"][0]
    words = script_words(container, {"MODEL": "m", "GPUS_PER_NODE": "4", "LWS_GROUP_SIZE": "2"})
    args = build_parser().parse_args(words[2:])
    assert args.ray_address == "127.0.0.1:6379"
    assert (args.tp, args.pp) == (4, 2)
    # The Ray-wait snippet is Python: it must at least compile.
    snippet = script[script.index('python3 -c "') + len('python3 -c "') : script.index('"; do')]
    compile(snippet.replace("${LWS_GROUP_SIZE}", "2"), "leader-wait", "exec")


@pytest.mark.parametrize(("role", "index"), [("leaderTemplate", "0"), ("workerTemplate", "1")])
def test_every_pod_of_a_group_serves_its_rank_with_the_leader_as_master(
    role: str, index: str
) -> None:
    container = container_of(role)
    env = {"MODEL": "m", "GPUS_PER_NODE": "4", **LWS_ENV, "LWS_WORKER_INDEX": index}
    args = build_parser().parse_args(script_words(container, env)[2:])
    assert (args.command, args.nodes, args.node_rank) == ("serve", 2, int(index))
    assert args.master_addr == LWS_ENV["LWS_LEADER_ADDRESS"]
    assert args.tp == 4
    assert args.ray_address is None
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    if role == "leaderTemplate":  # vLLM's master port and the node link, as served
        assert (ports["vllm-master"], ports["node-link"]) == (args.master_port,
                                                              args.master_port + 1)


def test_the_leader_and_the_workers_plan_with_the_same_options() -> None:
    def planning(role: str, index: str) -> dict[str, Any]:
        env = {"MODEL": "m", "GPUS_PER_NODE": "4", **LWS_ENV, "LWS_WORKER_INDEX": index}
        ns = vars(build_parser().parse_args(script_words(container_of(role), env)[2:]))
        # where each binds, logs and its rank are its own; everything that plans must agree
        own = {"node_rank", "host", "port", "engine_port", "log_dir", "func"}
        return {k: v for k, v in ns.items() if k not in own}

    assert planning("leaderTemplate", "0") == planning("workerTemplate", "1")


def test_every_pod_of_a_group_presents_the_same_node_secret_only_it_can_read() -> None:
    """The node link admits only pods holding the group's secret: both roles mount the one
    Secret, read-only, with no group/other bits (launcher serve refuses those), and pass its
    file to --node-secret-file."""
    env = {"MODEL": "m", "GPUS_PER_NODE": "4", **LWS_ENV, "LWS_WORKER_INDEX": "0"}
    template = lws()["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        spec = template[role]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        (container,) = spec["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "node-secret"]
        secret = volumes["node-secret"]["secret"]
        assert secret["secretName"] == "toposerve-node"
        assert secret.get("optional") is not True
        assert secret["defaultMode"] & 0o077 == 0
        assert mount["readOnly"] is True
        args = build_parser().parse_args(script_words(container, env)[2:])
        assert args.node_secret_file == Path(mount["mountPath"]) / "secret"
