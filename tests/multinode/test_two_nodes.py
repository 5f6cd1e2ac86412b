"""Two nodes on this machine, each a `launcher serve` of its own bound to its own core, serving
the embedded model as two layer stages (PP=2) with vLLM's own multi-node executor: node 0 (the
head) runs stage 0 and the proxy, node 1 runs stage 1 headless. The command lines are the ones
`launcher plan --nodes 2 --master-addr ...` prints for each node, with only this run's proxy port,
log folder, drain time, start-up bound and node secret file (which the head writes) added.

vLLM starts once for the whole module; the tests run in file order, and the last two break the
group on purpose (SIGKILL of node 1's stage, then SIGTERM of the head).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from launcher.engine.supervise import free_port, group_alive, http_ok
from tests.conftest import REPO
from tests.multinode.procs import (
    MAX_MODEL_LEN,
    Proc,
    cpu_build_only,
    descendants,
    free_master_port,
    still_alive,
)
from tests.support import early

LAUNCHER = Path(sys.executable).with_name("launcher")
SERVED = "toposerve-tiny"
START_TIMEOUT_S = 900.0  # two vLLM starts sharing two busy cores
WITHIN_S = 30.0  # "within seconds": a generous bound for a loaded CI machine, measured far less

pytestmark = cpu_build_only


@dataclass
class Node:
    rank: int
    argv: list[str]
    proc: subprocess.Popen[bytes]
    out: Path

    def output(self) -> str:
        return self.out.read_text(errors="replace")


@dataclass
class Group:
    head: Node
    other: Node
    url: str
    printed: list[list[str]]  # what `launcher plan` printed for each node


def planned_lines(tiny_model_path: str, master_port: int, env: dict[str, str]
                  ) -> list[list[str]]:
    done = subprocess.run(
        [str(LAUNCHER), "plan", "--model", tiny_model_path, "--served-model-name", SERVED,
         "--max-model-len", MAX_MODEL_LEN, "--nodes", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(master_port), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr
    nodes = json.loads(done.stdout)["node_commands"]
    assert [n["node_rank"] for n in nodes] == [0, 1]
    return [n["serve"] for n in nodes]


def start_node(rank: int, words: list[str], tmp: Path, proxy_port: int, env: dict[str, str]
               ) -> Node:
    assert words[:2] == ["launcher", "serve"], words
    # this run's own port, logs, drain and start-up bound: options `launcher serve` has and
    # `launcher plan` has not
    own = ["--log-dir", str(tmp / f"logs{rank}"), "--grace", "10", "--ready-timeout", "600",
           "--node-secret-file", str(tmp / "node-secret")]
    if rank == 0:
        own += ["--port", str(proxy_port)]
    argv = ["taskset", "-c", str(rank), str(LAUNCHER), *words[1:], *own]
    out = tmp / f"node{rank}.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, env=env)
    return Node(rank, argv, proc, out)


def begin_group(tmp: Path) -> Group:
    """Both nodes started as `launcher plan` printed them, once the head's proxy is ready."""
    from launcher.model.tinymodel import ensure_tiny_model

    master = free_master_port()
    env = early.environ()
    printed = planned_lines(str(ensure_tiny_model(env)), master, env)
    port = free_port()
    head = start_node(0, printed[0], tmp, port, env)
    nodes = [head]
    try:
        # the head writes the group's secret (it has none); node 1 is given that file, as a
        # user copies it to the other machine
        started = time.monotonic()
        while not (tmp / "node-secret").exists():
            assert head.proc.poll() is None, head.output()
            assert time.monotonic() - started < 120, head.output()
            early.pause(0.2)
        other = start_node(1, printed[1], tmp, port, env)
        nodes.append(other)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not http_ok(f"{url}/ready"):
            for node in (head, other):
                assert node.proc.poll() is None, f"node {node.rank} exited:\n{node.output()}"
            assert time.monotonic() < deadline, head.output() + other.output()
            early.pause(1.0)
    except BaseException:
        _kill(nodes)
        raise
    return Group(head, other, url, printed)


def _kill(nodes: list[Node]) -> None:
    for node in nodes:
        if node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait()


def end_group(group: Group) -> None:
    _kill([group.head, group.other])


# started in the background at collection (its tests run after the pure ones)
group = early.held(__file__, "group", begin_group, end_group)


def stage_of(procs: list[Proc]) -> list[str]:
    return sorted(p.title.split()[0] for p in procs if p.title.startswith("VLLM::Worker"))


def cpus_allowed(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(ln.split()[1] for ln in status.splitlines() if ln.startswith("Cpus_allowed_list"))


def test_the_plan_prints_one_serve_line_per_node_that_differ_only_in_the_rank(
    group: Group,
) -> None:
    zero, one = group.printed
    at = zero.index("--node-rank")
    assert (zero[at + 1], one[at + 1]) == ("0", "1")
    assert zero[:at] + zero[at + 2:] == one[:at] + one[at + 2:]


def test_the_head_wrote_the_node_secret_and_node_1_joined_with_it(group: Group) -> None:
    secret = Path(group.head.argv[group.head.argv.index("--node-secret-file") + 1])
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
    assert f"Node secret: wrote a new one to {secret} (mode 600)" in group.head.output()
    assert f"Node secret: from {secret}" in group.other.output()
    assert "joined the head at 127.0.0.1:" in group.other.output()


def test_the_head_proxy_lists_the_model(group: Group) -> None:
    models = httpx.get(f"{group.url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [SERVED]


def test_each_layer_stage_runs_under_its_own_nodes_process_tree_on_its_own_core(
    group: Group,
) -> None:
    head_tree, other_tree = descendants(group.head.proc.pid), descendants(group.other.proc.pid)
    assert stage_of(head_tree) == ["VLLM::Worker_PP0"], [p.title for p in head_tree]
    assert stage_of(other_tree) == ["VLLM::Worker_PP1"], [p.title for p in other_tree]
    for rank, tree in ((0, head_tree), (1, other_tree)):
        (worker,) = [p for p in tree if p.title.startswith("VLLM::Worker")]
        assert cpus_allowed(worker.pid) == str(rank)


def test_a_completion_streams_through_both_stages_with_exact_counts(group: Group) -> None:
    body = {"model": SERVED, "prompt": list(range(10, 42)), "max_tokens": 24, "min_tokens": 24,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    events = []
    with httpx.stream("POST", f"{group.url}/v1/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    assert len([e for e in events if e.get("choices")]) >= 2  # streamed, not one answer
    usage = events[-1]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (32, 24)


def test_loadgen_gets_exact_token_counts_through_the_head(group: Group, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    done = subprocess.run(
        [sys.executable, "-m", "loadgen", "--url", group.url, "--prompt", "512", "--gen", "64",
         "--requests", "2", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    assert (data["summary"]["requests_ok"], data["summary"]["requests_failed"]) == (2, 0)
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in data["requests"]] == [
        (512, 64)] * 2


def test_sigkill_of_node_1s_stage_gives_503_and_names_the_node_within_seconds(
    group: Group,
) -> None:
    (stage,) = [p for p in descendants(group.other.proc.pid)
                if p.title.startswith("VLLM::Worker_PP1")]
    body = {"model": SERVED, "prompt": "def f(", "max_tokens": 2}
    stage_pid = stage.pid
    killed = time.monotonic()
    os.kill(stage_pid, signal.SIGKILL)
    status, retry_after, waited, error = 0, None, 0.0, {}
    group_codes = ("engine_group_node_down", "engine_group_restarting")
    while time.monotonic() - killed < WITHIN_S:
        try:
            resp = httpx.post(f"{group.url}/v1/completions", json=body, timeout=3)
            status, retry_after = resp.status_code, resp.headers.get("retry-after")
            error = resp.json().get("error") or {} if status == 503 else {}
        except httpx.HTTPError:
            status = 0  # the head's vLLM hangs (or drops the answer) until the launcher stops it
        waited = time.monotonic() - killed
        if status == 503 and error.get("code") in group_codes:
            break
        time.sleep(0.25)
    print(f"503 naming the node after {waited:.1f}s")  # the figure docs/deploy.md quotes
    assert status == 503, f"no 503 within {WITHIN_S:.0f}s (last status {status})"
    assert retry_after is not None
    assert int(retry_after) > 0
    # which node, in the OpenAI format, without the group's addresses
    assert error["code"] in group_codes, error
    assert "node 1 of the 2-node engine group is down" in error["message"]
    assert "127.0.0.1" not in error["message"]
    deadline = time.monotonic() + WITHIN_S
    while "node 1 (127.0.0.1)" not in group.head.output():
        assert time.monotonic() < deadline, group.head.output()[-3000:]
        time.sleep(0.25)
    (line,) = [ln for ln in group.head.output().splitlines() if "node 1 (127.0.0.1)" in ln]
    assert f"VLLM::Worker_PP1 (pid {stage_pid}) is gone" in line


def test_sigterm_on_the_head_stops_both_nodes_and_leaves_no_process(group: Group) -> None:
    trees = descendants(group.head.proc.pid) + descendants(group.other.proc.pid)
    group.head.proc.send_signal(signal.SIGTERM)
    assert group.head.proc.wait(timeout=120) == 0, group.head.output()[-3000:]
    assert group.other.proc.wait(timeout=60) == 0, group.other.output()[-3000:]
    assert not http_ok(f"{group.url}/health")
    assert still_alive(trees) == []
    assert not any(group_alive(p.pgid) for p in trees)
    assert "no process left behind" in group.head.output()
    assert "The head asked every node to stop" in group.other.output()
