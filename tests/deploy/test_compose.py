"""deploy/compose.yaml and the files it mounts and builds.

No Docker engine (nor the compose plugin) runs here, so the file is validated against the
Compose Specification's JSON schema (vendored by check-jsonschema) as written and after variable
interpolation, and checked for what matters on a GPU box: GPU reservations, the official vLLM
image, ports on loopback, and that every mount, build file and scrape target points at something
that exists in this repository.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from server.config import config_from_args
from tests.deploy.shipped import DEPLOY, PROMETHEUS_YML

COMPOSE = DEPLOY / "compose.yaml"
ENV_EXAMPLE = DEPLOY / ".env.example"
_INTERPOLATION = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}|\$(\w+)")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's variable syntax: $VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, $$."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        value = env.get(name)
        empty = value is None or (value == "" and op is not None and op.startswith(":"))
        if op and op.endswith("?") and empty:
            raise KeyError(f"{name}: {arg}")
        if op and op.endswith("-") and empty:
            return arg
        return value or ""

    return _INTERPOLATION.sub(one, text)


def read_env_file(path: Path) -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    return {k.strip(): v.strip() for k, v in pairs}


def rendered(env: Mapping[str, str]) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(interpolate(COMPOSE.read_text(), env))
    return data


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return rendered(read_env_file(ENV_EXAMPLE))


def check_schema(path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_interpolation_follows_compose_rules() -> None:
    env = {"SET": "v", "EMPTY": ""}
    cases = [
        ("${SET:-d}", "v"), ("${EMPTY:-d}", "d"), ("${EMPTY-d}", ""), ("${UNSET-d}", "d"),
        ("$SET/x", "v/x"), ("$$SET", "$SET"), ("${UNSET}", ""),
    ]  # fmt: skip
    for text, expected in cases:
        assert interpolate(text, env) == expected, text
    with pytest.raises(KeyError):
        interpolate("${EMPTY:?set it}", env)


def test_compose_file_matches_the_compose_specification_as_written() -> None:
    check_schema(COMPOSE)


@pytest.mark.parametrize("env_name", ["example", "empty"])
def test_compose_file_matches_the_specification_after_interpolation(
    env_name: str, tmp_path: Path
) -> None:
    env = read_env_file(ENV_EXAMPLE) if env_name == "example" else {}
    out = tmp_path / "compose.yaml"
    out.write_text(yaml.safe_dump(rendered(env)))
    check_schema(out)


def test_vllm_runs_the_official_image_with_every_gpu_reserved(compose: dict[str, Any]) -> None:
    vllm = compose["services"]["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:")
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert vllm["ipc"] == "host"  # NCCL shared memory between TP/PP workers


def test_vllm_runs_with_the_prefix_cache_flags_launcher_serve_gives_it(
    compose: dict[str, Any]
) -> None:
    """Without --enable-prompt-tokens-details vLLM's usage has no cached_tokens: `loadgen
    --depth` and the agent workload against the compose stack would say "the server reported no
    cached tokens" and the dashboard's cached-tokens columns would stay empty."""
    from launcher.engine.enginecmd import EngineCommand

    served = EngineCommand(model="m", host="127.0.0.1", port=8001).argv()
    wanted = [a for a in served if a in ("--enable-prefix-caching",
                                         "--enable-prompt-tokens-details")]
    assert len(wanted) == 2
    assert set(wanted) <= set(compose["services"]["vllm"]["command"].split())


def test_proxy_gets_the_gpus_for_nvml_only(compose: dict[str, Any]) -> None:
    proxy = compose["services"]["proxy"]
    devices = proxy["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia"
    assert "gpu" in devices[0]["capabilities"]
    assert proxy["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_every_published_port_is_on_loopback(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on all addresses"


def test_proxy_points_at_vllms_port(compose: dict[str, Any]) -> None:
    vllm_cmd = compose["services"]["vllm"]["command"].split()
    port = vllm_cmd[vllm_cmd.index("--port") + 1]
    proxy_cmd = compose["services"]["proxy"]["command"]
    assert proxy_cmd[proxy_cmd.index("--upstream") + 1] == f"http://vllm:{port}"


def test_prometheus_scrapes_the_compose_services_on_their_ports(compose: dict[str, Any]) -> None:
    services = compose["services"]
    vllm_cmd = services["vllm"]["command"].split()
    proxy_cmd = services["proxy"]["command"]
    expected = {
        "toposerve-proxy": f"proxy:{proxy_cmd[proxy_cmd.index('--port') + 1]}",
        "vllm": f"vllm:{vllm_cmd[vllm_cmd.index('--port') + 1]}",
        "pushgateway": "pushgateway:9091",  # the Pushgateway image's default port
    }
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    scraped = {
        job["job_name"]: job["static_configs"][0]["targets"][0] for job in config["scrape_configs"]
    }
    assert scraped == expected
    assert all(target.split(":")[0] in services for target in scraped.values())


def test_mounted_host_paths_exist(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name} mounts missing {source}"


def test_prometheus_is_given_the_mounted_config(compose: dict[str, Any]) -> None:
    prom = compose["services"]["prometheus"]
    mounts = dict(v.split(":")[:2] for v in prom["volumes"])
    config_arg = next(a for a in prom["command"] if a.startswith("--config.file="))
    in_container = Path(config_arg.split("=", 1)[1])
    host_dir = next(h for h, c in mounts.items() if in_container.is_relative_to(c))
    assert (DEPLOY / host_dir / in_container.relative_to(mounts[host_dir])) == PROMETHEUS_YML


def test_grafana_provisioning_loads_the_mounted_dashboard(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    mounts = {c: h for h, c in (v.split(":")[:2] for v in grafana["volumes"])}
    provider = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/dashboards/toposerve.yml").read_text()
    )["providers"][0]
    dashboards_host = DEPLOY / mounts[provider["options"]["path"]]
    assert (dashboards_host / "toposerve.json").is_file()
    home = Path(grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert (dashboards_host / home.relative_to(provider["options"]["path"])).is_file()
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
    datasource = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"][0]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "${PROMETHEUS_URL}"
    assert grafana["environment"]["PROMETHEUS_URL"] == "http://prometheus:9090"


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "proxy.Dockerfile"])
def test_dockerfiles_copy_only_what_exists_and_is_not_ignored(dockerfile: str) -> None:
    text = (DEPLOY / "docker" / dockerfile).read_text()
    allowed = {
        line[1:].rstrip("/")
        for line in (DEPLOY / "docker" / f"{dockerfile}.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copied = [line.split()[1:-1] for line in text.splitlines() if line.startswith("COPY ")]
    for sources in copied:
        for source in sources:
            assert (DEPLOY.parent / source).exists(), f"{dockerfile} copies missing {source}"
            assert source.rstrip("/") in allowed, f"{source} is excluded by the .dockerignore"


def test_compose_builds_the_proxy_image_from_the_repository(compose: dict[str, Any]) -> None:
    build = compose["services"]["proxy"]["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert (context / build["dockerfile"]).is_file()
    assert (context / "pyproject.toml").is_file()


def test_proxy_command_is_accepted_by_the_proxy(compose: dict[str, Any]) -> None:
    config = config_from_args(compose["services"]["proxy"]["command"], env={})
    assert config.upstreams == ("http://vllm:8001",)
    assert (config.host, config.port) == ("0.0.0.0", 8000)


def test_proxy_image_default_command_is_accepted_by_the_proxy() -> None:
    lines = (DEPLOY / "docker" / "proxy.Dockerfile").read_text().splitlines()
    entrypoint = yaml.safe_load(next(x for x in lines if x.startswith("ENTRYPOINT "))[11:])
    cmd = yaml.safe_load(next(x for x in lines if x.startswith("CMD "))[4:])
    assert entrypoint == ["python", "-m", "server"]
    assert config_from_args(cmd, env={}).upstreams == ("http://vllm:8001",)


# -- deploy/compose.nodes.yaml: one node of a multi-node group (vLLM's own executor) ------------

NODES_COMPOSE = DEPLOY / "compose.nodes.yaml"
NODES_ENV = DEPLOY / "compose.nodes.env.example"


def rendered_nodes(env: Mapping[str, str]) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(interpolate(NODES_COMPOSE.read_text(), env))
    return data


def test_node_compose_file_matches_the_specification_as_written_and_interpolated(
    tmp_path: Path,
) -> None:
    check_schema(NODES_COMPOSE)
    out = tmp_path / "compose.nodes.yaml"
    out.write_text(yaml.safe_dump(rendered_nodes(read_env_file(NODES_ENV))))
    check_schema(out)


def test_a_node_without_its_rank_or_the_heads_address_is_refused_by_compose() -> None:
    env = read_env_file(NODES_ENV)
    for name in ("NODE_RANK", "MASTER_ADDR", "NODE_SECRET_FILE"):
        with pytest.raises(KeyError, match=name):
            rendered_nodes({k: v for k, v in env.items() if k != name})


@pytest.mark.parametrize("rank", ["0", "1"])
def test_every_node_runs_launcher_serve_with_its_rank_on_the_host_network(rank: str) -> None:
    from launcher.cli.main import build_parser

    env = {**read_env_file(NODES_ENV), "NODE_RANK": rank, "TOPOSERVE_ARGS": "--tp 4"}
    service = rendered_nodes(env)["services"]["toposerve"]
    # the image's entrypoint is `launcher serve` (deploy/docker/Dockerfile)
    args = build_parser().parse_args(["serve", *service["command"].split()])
    assert (args.nodes, args.node_rank, args.master_addr) == (2, int(rank), env["MASTER_ADDR"])
    assert (args.master_port, args.tp) == (int(env["MASTER_PORT"]), 4)
    assert args.host == "127.0.0.1"  # the head's proxy stays on loopback unless told
    # the nodes reach each other's vLLM ports directly, and pick the interface between them
    assert service["network_mode"] == "host"
    assert "ports" not in service
    assert service["environment"]["GLOO_SOCKET_IFNAME"] == env["NODE_IFNAME"]
    assert service["environment"]["NCCL_SOCKET_IFNAME"] == env["NODE_IFNAME"]
    assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    # the node link's secret: one file, given to every node as a Compose secret
    assert args.node_secret_file == Path("/run/secrets/node-secret")
    assert service["secrets"] == ["node-secret"]
    assert rendered_nodes(env)["secrets"]["node-secret"] == {"file": env["NODE_SECRET_FILE"]}
