"""`launcher plan` and `launcher serve` with --nodes --node-rank --master-addr (vLLM's own
multi-node executor), and --ray-address on the CPU build: what they print and refuse, before
anything starts."""

from __future__ import annotations

import json
import shlex

import pytest

from launcher.cli.main import main
from tests.launcher.paths import MODELS, TOPOLOGIES

FOUR_GPUS = str(TOPOLOGIES / "4xh200-nvswitch.nvml.json")
LLAMA70B = str(MODELS / "llama-3.3-70b")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(("argv", "says"), [
    (["--node-rank", "1"], "--node-rank 1 needs --master-addr HEAD"),
    (["--master-addr", "10.0.0.1"], "pass --nodes N (2 or more)"),
    (["--nodes", "2", "--master-addr", "10.0.0.1", "--node-rank", "2"],
     "--node-rank 2 with --nodes 2: the head is 0, the other nodes 1..1"),
    (["--nodes", "2", "--master-addr", "10.0.0.1", "--ray-address", "10.0.0.1:6379"],
     "two ways to span nodes: pass one"),
    (["--nodes", "2", "--master-addr", "10.0.0.1", "--master-port", "65535"],
     "the node link needs the next port too"),
    (["--nodes", "2", "--master-addr", "10.0.0.1", "--pp", "3"],
     "does not split into 2 equal shares of layer stages"),
])  # fmt: skip
def test_options_that_make_no_group_are_one_line_before_anything_starts(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    code, _, err = run(capsys, "serve", "--dry-run", "--port", "0", *argv)
    assert code != 0
    (line,) = err.strip().splitlines()
    assert says in line


def test_the_cpu_build_refuses_ray_in_one_line_with_the_fix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "serve", "--dry-run", "--port", "0", "--ray-address",
                         "127.0.0.1:6379", "--pp", "2")
    assert code == 1
    assert "engine:" not in out  # refused before any command is built
    (line,) = err.strip().splitlines()
    assert "vLLM's CPU build cannot run on a Ray cluster" in line
    assert "--nodes N --node-rank R --master-addr HEAD" in line


def test_plan_prints_each_nodes_serve_line_and_vllm_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "plan", "--model", LLAMA70B, "--topology", FOUR_GPUS,
                         "--nodes", "2", "--master-addr", "10.0.0.1", "--json")
    assert code == 0, err
    nodes = json.loads(out)["node_commands"]
    assert [n["node_rank"] for n in nodes] == [0, 1]
    for rank, node in enumerate(nodes):
        serve = node["serve"]
        assert serve[:2] == ["launcher", "serve"]
        assert serve[serve.index("--node-rank") + 1] == str(rank)
        assert serve[serve.index("--master-addr") + 1] == "10.0.0.1"
        assert serve[serve.index("--master-port") + 1] == "29500"
        assert serve[serve.index("--topology") + 1] == FOUR_GPUS
        argv = node["argv"]
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert ("--headless" in argv) == (rank > 0)
        assert "--distributed-executor-backend" not in argv
        assert (argv[argv.index("--tensor-parallel-size") + 1],
                argv[argv.index("--pipeline-parallel-size") + 1]) == ("4", "2")


def test_each_printed_line_serves_what_plan_printed_for_that_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "plan", "--model", LLAMA70B, "--topology", FOUR_GPUS,
                       "--nodes", "2", "--master-addr", "10.0.0.1", "--json")
    assert code == 0
    for node in json.loads(out)["node_commands"]:
        code, served, err = run(capsys, *node["serve"][1:], "--dry-run", "--port", "0",
                                "--engine-port", "8000")
        assert code == 0, err
        (engine,) = [ln for ln in served.splitlines() if ln.strip().startswith("engine:")]
        words = shlex.split(engine)[1:]
        assert words[words.index("vllm"):] == node["argv"]


def test_plan_without_the_heads_address_says_where_to_put_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "plan", "--model", LLAMA70B, "--topology", FOUR_GPUS,
                       "--nodes", "2")
    assert code == 0
    assert "--master-addr HEAD --master-port 29500 --node-rank 1" in out
    assert "replace HEAD with the head's address" in out


def test_plan_says_the_other_nodes_need_the_heads_node_secret(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "plan", "--model", LLAMA70B, "--topology", FOUR_GPUS,
                       "--nodes", "2", "--master-addr", "10.0.0.1")
    assert code == 0
    assert "node 0 writes one on its first start" in out
    assert "--node-secret-file" in out


def test_a_node_other_than_the_head_plans_its_share_headless_without_a_proxy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "serve", "--dry-run", "--port", "0", "--nodes", "2",
                         "--node-rank", "1", "--master-addr", "127.0.0.1", "--max-model-len",
                         "1024")
    assert code == 0, err
    (engine,) = [ln for ln in out.splitlines() if ln.strip().startswith("engine:")]
    argv = shlex.split(engine)
    assert "VLLM_TARGET_DEVICE=cpu" in argv  # a headless CPU node finds no platform by itself
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert "--headless" in argv
    assert "proxy upstreams" not in out
    assert "node 1 of 2: this node's share of the layers, headless" in out


def test_a_users_thread_binding_is_kept(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    code, out, _ = run(capsys, "serve", "--dry-run", "--port", "0", "--nodes", "2",
                       "--node-rank", "1", "--master-addr", "127.0.0.1")
    assert code == 0
    (engine,) = [ln for ln in out.splitlines() if ln.strip().startswith("engine:")]
    # the user's own settings pass through the environment, not set again by us
    assert not any(w.startswith(("VLLM_CPU_OMP_THREADS_BIND=", "VLLM_TARGET_DEVICE="))
                   for w in shlex.split(engine))
