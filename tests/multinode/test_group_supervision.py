"""How the head and another node supervise each other (launcher/engine/nodes.py), fast: two real
`launcher serve` processes, their node link and the head's proxy, with vLLM replaced by the
stand-in engine (tests/serve/standin_engine.py, through TOPOSERVE_ENGINE_CMD), which serves
/health and /v1/models like vLLM and can be killed like it. test_two_nodes.py runs the same
with vLLM itself."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from launcher.engine.nodesecret import SECRET_ENV
from launcher.engine.supervise import free_port, http_ok
from tests.conftest import REPO
from tests.multinode.procs import Proc, descendants, free_master_port, still_alive

STANDIN = REPO / "tests" / "serve" / "standin_engine.py"
WITHIN_S = 30.0  # generous for a loaded machine; the figures are printed as measured
SECRET = secrets.token_hex(32)  # the group's node secret, as a Kubernetes Secret's env variable


@dataclass
class Launcher:
    proc: subprocess.Popen[bytes]
    out: Path

    def output(self) -> str:
        return self.out.read_text(errors="replace")


def launch(tmp: Path, name: str, master_port: int, *args: str,
           secret: str = SECRET) -> Launcher:
    env = {**os.environ, "TOPOSERVE_ENGINE_CMD": f"{sys.executable} {STANDIN}",
           "STANDIN_STATE": str(tmp / f"state-{name}"), SECRET_ENV: secret}
    argv = [sys.executable, "-m", "launcher", "serve", "--max-model-len", "1024", "--nodes", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(master_port), "--log-dir",
            str(tmp / f"logs-{name}"), "--grace", "2", "--ready-timeout", "60", *args]
    out = tmp / f"{name}.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return Launcher(proc, out)


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float = WITHIN_S) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout_s, f"not within {timeout_s:.0f}s: {what}"
        time.sleep(0.1)
    return time.monotonic() - started


@dataclass
class Pair:
    head: Launcher
    node: Launcher
    url: str
    master_port: int


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    master = free_master_port()
    port = free_port()
    head = launch(tmp_path, "head", master, "--node-rank", "0", "--port", str(port))
    node = launch(tmp_path, "node", master, "--node-rank", "1")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("the head's proxy ready", lambda: http_ok(f"{url}/ready"), 120)
        wait_for("node 1's share started", lambda: "vLLM share started" in node.output(), 60)
        yield Pair(head, node, url, master)
    finally:
        for launcher in (head, node):
            if launcher.proc.poll() is None:
                launcher.proc.kill()
                launcher.proc.wait()


def share_of(launcher: Launcher) -> list[Proc]:
    return descendants(launcher.proc.pid)


def answers_503(url: str) -> bool:
    try:
        resp = httpx.post(f"{url}/v1/completions", json={"model": "x", "prompt": "a"}, timeout=3)
    except httpx.HTTPError:
        return False
    return resp.status_code == 503 and int(resp.headers["retry-after"]) > 0


def test_a_node_whose_share_is_killed_is_named_at_the_head_and_the_proxy_answers_503(
    pair: Pair,
) -> None:
    (share,) = [p for p in share_of(pair.node) if "standin_engine" in p.title]
    os.kill(share.pid, signal.SIGKILL)
    took = wait_for("503 at the head", lambda: answers_503(pair.url))
    wait_for("the head names node 1", lambda: "node 1 (127.0.0.1)" in pair.head.output())
    print(f"503 {took:.1f}s after the SIGKILL")
    (line,) = [ln for ln in pair.head.output().splitlines() if "node 1 (127.0.0.1)" in ln]
    assert "its vLLM share exited (vLLM was killed by SIGKILL)" in line
    # the client is told which node, in the OpenAI format, and nothing of the network inside
    error = httpx.post(f"{pair.url}/v1/completions", json={"model": "x", "prompt": "a"},
                       timeout=10).json()["error"]
    assert error["code"] in ("engine_group_node_down", "engine_group_restarting"), error
    assert "node 1 of the 2-node engine group is down" in error["message"]
    assert "127.0.0.1" not in error["message"]
    assert "pid" not in error["message"]
    # the group is restarted whole: node 1 hears of the new epoch and starts its share again
    wait_for("node 1 restarts its share",
             lambda: "The head restarted vLLM (epoch 2)" in pair.node.output())
    wait_for("the head's proxy ready again", lambda: http_ok(f"{pair.url}/ready"), 60)


def test_a_node_whose_launcher_dies_is_named_at_the_head(pair: Pair) -> None:
    pair.node.proc.kill()
    took = wait_for("503 at the head", lambda: answers_503(pair.url))
    print(f"503 {took:.1f}s after the node's launcher was killed")
    assert "node 1 (127.0.0.1) left the node link" in pair.head.output()
    # said once the head's own vLLM has stopped, which comes after the 503s begin
    wait_for("the head waits for node 1",
             lambda: "waiting for node 1 to join the node link again" in pair.head.output())


def test_a_node_whose_head_dies_stops_its_share_and_exits_with_one_line(pair: Pair) -> None:
    share = share_of(pair.node)
    pair.head.proc.kill()  # the head's own vLLM dies with it (PR_SET_PDEATHSIG)
    started = time.monotonic()
    code = pair.node.proc.wait(timeout=WITHIN_S)
    print(f"node 1 stopped {time.monotonic() - started:.1f}s after the head was killed")
    assert code == 4
    assert still_alive(share) == []
    last = pair.node.output().strip().splitlines()[-1]
    assert last.startswith("launcher: error: the head at 127.0.0.1:")
    assert "closed the node link: stopped this node's vLLM share" in last


def test_sigterm_on_the_head_stops_the_other_node_and_leaves_nothing(pair: Pair) -> None:
    trees = share_of(pair.head) + share_of(pair.node)
    pair.head.proc.send_signal(signal.SIGTERM)
    assert pair.head.proc.wait(timeout=60) == 0
    assert pair.node.proc.wait(timeout=60) == 0
    assert still_alive(trees) == []
    assert "Every other node stopped its vLLM share." in pair.head.output()
    assert "The head asked every node to stop" in pair.node.output()


def test_a_node_that_cannot_reach_the_head_says_where_it_looked(tmp_path: Path) -> None:
    master = free_master_port()  # no head there, nothing on the next port either
    node = launch(tmp_path, "node", master, "--node-rank", "1", "--join-timeout", "3")
    assert node.proc.wait(timeout=60) == 4
    last = node.output().strip().splitlines()[-1]
    assert last.startswith(f"launcher: error: cannot reach the head at 127.0.0.1:{master + 1}")
    assert "check that `launcher serve --node-rank 0` runs there" in last
    assert "Traceback" not in node.output()


def test_a_node_whose_plan_or_secret_differs_is_refused_in_one_line_and_the_group_runs_on(
    pair: Pair, tmp_path: Path
) -> None:
    other = launch(tmp_path, "other", pair.master_port, "--node-rank", "1", "--max-model-len",
                   "512")
    stranger = launch(tmp_path, "stranger", pair.master_port, "--node-rank", "1",
                      secret=secrets.token_hex(32))
    assert other.proc.wait(timeout=60) == 4
    last = other.output().strip().splitlines()[-1]
    assert "refused this node: node 1 planned differently from the head" in last
    assert "max_model_len 512 here against 1024 on the head" in last
    assert stranger.proc.wait(timeout=60) == 4
    last = stranger.output().strip().splitlines()[-1]
    assert last.startswith("launcher: error: the head at 127.0.0.1:")
    assert "refused this node: this node did not prove it holds the head's node secret" in last
    assert "Traceback" not in stranger.output()
    wait_for("the head's one line", lambda: "did not prove it holds the group's node secret"
             in pair.head.output())
    (line,) = [ln for ln in pair.head.output().splitlines() if "node secret" in ln
               and "refused" in ln]
    assert line == ("! node link: refused a connection from 127.0.0.1: node 1 did not prove it "
                    "holds the group's node secret")
    assert "Traceback" not in pair.head.output()
    assert http_ok(f"{pair.url}/ready")  # the real node 1 is still in the group
    assert "node 1 (127.0.0.1)" not in pair.head.output()
