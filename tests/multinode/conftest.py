"""A Ray cluster of two nodes on this machine: a head and a second node, each a raylet of its own
with one CPU and a resource naming it (node1, node2); the head's GCS is reached at 127.0.0.1.

Started with Ray's own `ray start`, as on two real machines. Torn down by process: every process
of the two `ray start` sessions and their descendants, SIGTERM then SIGKILL (`ray stop` would stop
every Ray cluster on the machine, other users' too).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from launcher.engine.supervise import free_port

RAY = Path(sys.executable).with_name("ray")
START_TIMEOUT_S = 180.0


class RayStateError(RuntimeError):
    """Ray's state API did not answer (yet)."""


@dataclass
class RayCluster:
    address: str  # what `launcher serve --ray-address` and `ray start --address` take
    dashboard: str  # Ray's state API
    temp_dir: Path
    sessions: list[int]  # process groups of the two `ray start` runs

    def state(self, kind: str, *filters: str) -> list[dict[str, Any]]:
        """Ray's own record (`ray list KIND --detail --format json`)."""
        argv = [str(RAY), "list", kind, "--address", self.dashboard, "--format", "json",
                "--detail", "--limit", "1000"]
        for f in filters:
            argv += ["--filter", f]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=ray_env(),
                              check=False)
        if done.returncode != 0:
            raise RayStateError(done.stderr.strip()[-2000:])
        if done.stdout.startswith("No resource"):  # what `ray list` prints for none
            return []
        data: list[dict[str, Any]] = json.loads(done.stdout)
        return data

    def node_names(self) -> dict[str, str]:
        """Ray node id -> 'node1' / 'node2' (the resource each node was started with)."""
        names = {}
        for node in self.state("nodes", "state=ALIVE"):
            total = node.get("resources_total", {})
            names[node["node_id"]] = next((n for n in ("node1", "node2") if n in total), "?")
        return names


def ray_env() -> dict[str, str]:
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{RAY.parent}:"
            f"{os.environ.get('PATH', '')}"}


def _ray_start(args: list[str], log: Path) -> int:
    # Its own session: every daemon `ray start` leaves behind stays in this process group.
    with log.open("ab") as out:
        proc = subprocess.Popen([str(RAY), "start", *args], stdout=out, stderr=subprocess.STDOUT,
                                env=ray_env(), start_new_session=True)
    code = proc.wait(timeout=START_TIMEOUT_S)
    assert code == 0, f"ray start {' '.join(args)} exited {code}:\n{log.read_text()[-3000:]}"
    return proc.pid


def _descendants_of_groups(groups: list[int]) -> set[int]:
    parents: dict[int, int] = {}
    members = set()
    for pid_text in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid_text}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] in ("Z", "X"):
            continue
        pid = int(pid_text)
        parents[pid] = int(fields[1])
        if int(fields[2]) in groups:
            members.add(pid)
    grown = True
    while grown:  # Ray's workers set up process groups of their own under the raylets
        more = {pid for pid, ppid in parents.items() if ppid in members} - members
        grown = bool(more)
        members |= more
    return members


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"pid {pid} (gone)"
    return raw.replace(b"\0", b" ").decode(errors="replace")


def stop_cluster(groups: list[int], grace_s: float = 15.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process of the cluster; the pids still alive after.

    The processes are listed once, before any signal: a worker whose raylet died is re-parented
    to init and would no longer be found under the two sessions."""
    procs = _descendants_of_groups(groups)

    def alive() -> list[int]:
        return sorted(p for p in procs if _live(p))

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and alive():
            time.sleep(0.2)
    return alive()


def _live(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


# per module: its raylets and dashboard are stopped before the next module starts vLLM
@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    if not RAY.exists():
        raise AssertionError(f"{RAY} is missing: install the ray extra, "
                             "`.venv/bin/python -m pip install -e '.[ray]'` (scripts/setup.sh "
                             "--test does)")
    # Short: Ray puts unix sockets under it, and a socket path may not exceed 107 bytes.
    temp = Path(tempfile.mkdtemp(prefix="tsray", dir="/tmp"))
    port, dash = free_port(), free_port()
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--num-gpus", "0",
              "--disable-usage-stats"]
    groups: list[int] = []
    try:
        groups.append(_ray_start(
            ["--head", "--port", str(port), *common, "--resources", '{"node1": 1}',
             "--temp-dir", str(temp), "--include-dashboard", "true", "--dashboard-host",
             "127.0.0.1", "--dashboard-port", str(dash), "--ray-client-server-port",
             str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
             "--metrics-export-port", str(free_port())], temp / "head.log"))
        groups.append(_ray_start(
            ["--address", f"127.0.0.1:{port}", *common, "--resources", '{"node2": 1}',
             "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port",
             str(free_port())], temp / "node2.log"))
        cluster = RayCluster(f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}", temp, groups)
        deadline = time.monotonic() + START_TIMEOUT_S
        seen: object = None
        while True:
            try:
                seen = sorted(cluster.node_names().values())
            except RayStateError as exc:  # the dashboard is still starting
                seen = exc
            if seen == ["node1", "node2"]:
                break
            assert time.monotonic() < deadline, f"the two Ray nodes did not come up: {seen}"
            time.sleep(1.0)
        yield cluster
    finally:
        left = stop_cluster(groups)
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"Ray processes left: {[_cmdline(pid) for pid in left]}"
