"""deploy/systemd/: `systemd-analyze verify` and its offline security score on the real units.

The units run /opt/toposerve/venv/bin/...; verify insists that ExecStart exists, so the tests
install them with that prefix pointed at this virtual environment (the only change made). The
command lines are also parsed by the launcher's own argument parser.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from launcher.cli.main import build_parser
from server.config import config_from_args
from tests.deploy.shipped import DEPLOY

UNITS_DIR = DEPLOY / "systemd"
UNITS = sorted(p.name for p in UNITS_DIR.glob("*.service"))
INSTALL_PREFIX = "/opt/toposerve/venv"
MAX_EXPOSURE = 3.0  # systemd's scale: 0 safe ... 10 unsafe; "OK" ends at 4.9

needs_systemd = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


def directives(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) in file order; keys may repeat, as systemd allows."""
    out, section = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


def value(path: Path, section: str, key: str) -> str:
    found = [v for s, k, v in directives(path) if (s, k) == (section, key)]
    assert len(found) == 1, f"{path.name}: [{section}] {key} appears {len(found)} times"
    return found[0]


def installed(tmp_path: Path) -> list[Path]:
    prefix = str(Path(sys.executable).parent.parent)
    out = []
    for name in UNITS:
        target = tmp_path / name
        target.write_text((UNITS_DIR / name).read_text().replace(INSTALL_PREFIX, prefix))
        out.append(target)
    return out


def exec_argv(path: Path, env: Mapping[str, str]) -> list[str]:
    """ExecStart as systemd splits it: ${VAR} is one word, $VAR splits on whitespace."""
    words: list[str] = []
    for word in shlex.split(value(path, "Service", "ExecStart")):
        if re.fullmatch(r"\$\w+", word):
            words += env[word[1:]].split()
        else:
            words.append(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], word))
    return words


def env_example(name: str) -> dict[str, str]:
    lines = (UNITS_DIR / name).read_text().splitlines()
    pairs = (line.split("=", 1) for line in lines if line and not line.startswith("#"))
    return {k: v for k, v in pairs}


def test_there_are_units_for_the_launcher_the_other_nodes_and_the_proxy() -> None:
    assert UNITS == ["toposerve-node.service", "toposerve-proxy.service", "toposerve.service"]


@needs_systemd
def test_systemd_analyze_verify_finds_nothing_to_say(tmp_path: Path) -> None:
    units = installed(tmp_path)
    done = subprocess.run(
        ["systemd-analyze", "verify", *map(str, units)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout + done.stderr == "", done.stdout + done.stderr


@needs_systemd
@pytest.mark.parametrize("unit", UNITS)
def test_sandbox_exposure_is_low(unit: str, tmp_path: Path) -> None:
    path = next(p for p in installed(tmp_path) if p.name == unit)
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", f"--threshold={MAX_EXPOSURE * 10:.0f}",
         str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    level = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout + done.stderr)
    assert level, done.stdout + done.stderr
    assert float(level.group(1)) <= MAX_EXPOSURE, done.stdout


@pytest.mark.parametrize("unit", UNITS)
def test_units_restart_on_failure_and_drain_on_stop(unit: str) -> None:
    path = UNITS_DIR / unit
    assert value(path, "Service", "Restart") == "on-failure"
    # SIGTERM to the main process only: it drains the proxy and stops vLLM itself.
    assert value(path, "Service", "KillMode") == "mixed"
    assert int(value(path, "Unit", "StartLimitBurst")) > 0
    assert value(path, "Service", "NoNewPrivileges") == "true"
    assert value(path, "Service", "User") == "toposerve"


def test_launcher_unit_command_is_accepted_by_launcher_serve() -> None:
    path = UNITS_DIR / "toposerve.service"
    argv = exec_argv(path, env_example("toposerve.env.example"))
    assert argv[0] == f"{INSTALL_PREFIX}/bin/launcher"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "serve"
    assert (args.port, args.engine_port) == (8000, 8001)
    assert str(args.api_key_file) == "/etc/toposerve/api-keys"


def test_env_examples_define_every_variable_the_units_use() -> None:
    pairs = [("toposerve.service", "toposerve.env.example"),
             ("toposerve-node.service", "toposerve-node.env.example"),
             ("toposerve-proxy.service", "proxy.env.example")]  # fmt: skip
    for unit, example in pairs:
        exec_start = value(UNITS_DIR / unit, "Service", "ExecStart")
        used = set(re.findall(r"\$\{?(\w+)\}?", exec_start))
        missing = used - set(env_example(example))
        assert not missing, f"{example} lacks {missing}"


def test_proxy_unit_command_is_accepted_by_the_proxy() -> None:
    path = UNITS_DIR / "toposerve-proxy.service"
    argv = exec_argv(path, env_example("proxy.env.example"))
    assert argv[:3] == [f"{INSTALL_PREFIX}/bin/python", "-m", "server"]
    config = config_from_args(argv[3:], env={})
    assert config.upstreams == ("http://127.0.0.1:8001",)
    assert (config.host, config.port) == ("127.0.0.1", 8000)


def test_node_unit_serves_its_rank_of_the_group_headless() -> None:
    path = UNITS_DIR / "toposerve-node.service"
    env = env_example("toposerve-node.env.example")
    args = build_parser().parse_args(exec_argv(path, env)[1:])
    assert args.command == "serve"
    assert (args.nodes, args.node_rank) == (int(env["TOPOSERVE_NODES"]), 1)
    assert (args.master_addr, args.master_port) == (env["TOPOSERVE_MASTER_ADDR"],
                                                    int(env["TOPOSERVE_MASTER_PORT"]))
    # the node link's secret, handed over by systemd as a credential
    assert value(path, "Service", "LoadCredential") == "node-secret:/etc/toposerve/node-secret"
    assert args.node_secret_file == Path("%d/node-secret")
    # one role per machine: the head's unit and the proxy's are the others
    conflicts = value(path, "Unit", "Conflicts").split()
    assert sorted(conflicts) == ["toposerve-proxy.service", "toposerve.service"]


def test_the_heads_example_arguments_make_it_node_0_of_the_same_group() -> None:
    example = (UNITS_DIR / "toposerve.env.example").read_text()
    head = next(ln.split("TOPOSERVE_ARGS=", 1)[1] for ln in example.splitlines()
                if ln.startswith("#") and "--node-rank 0" in ln)
    node = env_example("toposerve-node.env.example")
    words = shlex.split(head)
    args = build_parser().parse_args(["serve", "--model", "m", *words])
    assert (args.nodes, args.node_rank) == (int(node["TOPOSERVE_NODES"]), 0)
    assert (args.master_addr, args.master_port) == (node["TOPOSERVE_MASTER_ADDR"],
                                                    int(node["TOPOSERVE_MASTER_PORT"]))
