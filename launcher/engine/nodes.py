"""`launcher serve` on a group of nodes with vLLM's own multi-node executor (`--nnodes`,
`--node-rank`, `--master-addr`): the head (rank 0) runs its share of vLLM and the proxy, every
other node its share headless. The launchers watch each other over the node link (nodelink.py),
because vLLM notices neither a lost node nor a lost head (measured: docs/deploy.md).

Head: a node whose share exits, or whose launcher falls silent, is named in one line; the head's
own vLLM is stopped at once (its stages cannot run without that node, and would only hang), so
the proxy answers 503 with Retry-After until the group is whole again and vLLM restarted
everywhere (a new epoch). SIGTERM drains the proxy, stops every node it can reach, then itself.

Node: waits up to the join timeout for the head's link, runs its share for the head's epoch,
and stops it when the head says so, or within nodelink.TIMEOUT_S + STOP_GRACE_S of the head
going silent (at once when the head's connection closes).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from launcher.engine import failures, nodelink, nodesecret, supervise
from launcher.engine.launchspec import LaunchSpec, ReplicaSpec
from launcher.engine.serve import Runner, SignalGuard, StopRequested, Supervision, run_with
from launcher.errors import EngineError
from launcher.model.tinymodel import default_cache_dir

STOP_GRACE_S = 5.0  # a node's share, when the head restarts the group or stops
HEAD_STOP_GRACE_S = 1.0
NODES_STOP_WAIT_S = 20.0


@dataclass(frozen=True)
class Group:
    """This node's place in the group, as `serve --nodes --node-rank --master-addr` said."""

    identity: nodelink.NodeIdentity
    master_addr: str
    master_port: int
    secret: bytes = b""  # the node link's (nodesecret.py); set before the group starts

    @property
    def link_port(self) -> int:
        return nodelink.link_port(self.master_port)


def exit_description(child: supervise.Child) -> str:
    code = child.exit_code()
    if code is None:
        return "still running"
    if code < 0 and -code in signal.valid_signals():
        return f"vLLM was killed by {signal.Signals(-code).name}"
    line = failures.last_error_line(child.log_tail()) if code else None
    return f"vLLM exited with code {code}" + (f"; last error: {line}" if line else "")


class ShareWatch:
    """The vLLM processes of a share (``VLLM::...``, as vLLM titles its engine core and
    workers): one that was seen and is gone means the share is broken, even while vLLM's main
    process lives on (it notices a lost worker only seconds later, measured 6 s)."""

    def __init__(self) -> None:
        self.seen: dict[int, str] = {}

    def lost(self, child: supervise.Child) -> str | None:
        if child.pid is None:
            return None
        now = {pid: title for pid, title in supervise.group_members(child.pid).items()
               if title.startswith("VLLM::")}
        gone = sorted(set(self.seen) - set(now))
        self.seen.update(now)
        if not gone:
            return None
        return f"its {self.seen[gone[0]].split()[0]} (pid {gone[0]}) is gone"


class HeadRunner(Runner):
    """The head: Runner's single engine and proxy, plus the node link."""

    def __init__(self, spec: LaunchSpec, sup: Supervision, console: Console,
                 group: Group) -> None:
        super().__init__(spec, sup, console)
        self.group = group
        # on the address the other nodes are told (the head's own, on their network)
        self.hub = nodelink.LinkHub(group.master_addr, group.link_port, group.identity,
                                    group.secret, on_refusal=self._say_refusal)

        self.status = StatusFile(sup.log_dir / f"engine-status-{spec.port}.json")

    def _say_refusal(self, line: str) -> None:
        self.console.print(f"[yellow]![/] {escape(line)}")

    def _proxy_child(self) -> supervise.Child:
        child = super()._proxy_child()
        return replace(child, argv=[*child.argv, "--engine-status-file", str(self.status.path)])

    def start(self) -> None:
        self.hub.start()
        nodes = self.group.identity.nodes
        self.console.print(f"Node link open on {group_port(self.group)}: waiting for "
                           f"{nodes - 1} more node(s) to join")
        self.status.write("restarting", f"the {nodes}-node engine group is starting")
        self.hub.set_epoch(1)
        super().start()
        self.status.clear()

    def supervise_forever(self) -> None:
        attempts, up_since = 0, time.monotonic()
        while not self.guard.stopping:
            time.sleep(0.5)
            down = self.hub.down_node()
            why = down[1] if down else self._own_exit()
            if why is None:
                if time.monotonic() - up_since > self.sup.healthy_reset_s:
                    attempts = 0
                self._restart_proxy_if_dead()
                continue
            attempts += 1
            # what a client is told: ranks only, never an address or a process
            nodes = self.group.identity.nodes
            gone = (f"node {down[0]} of the {nodes}-node engine group is down" if down
                    else f"the head node's share of the {nodes}-node engine group stopped")
            self._restart_group(why, attempts, gone)
            up_since = time.monotonic()

    def _own_exit(self) -> str | None:
        child = self.engines[0]
        return None if child.alive() else f"vLLM on the head exited ({exit_description(child)})"

    def _restart_group(self, why: str, attempt: int, gone: str) -> None:
        child = self.engines[0]
        self.status.write("node_down", f"{gone}; the group restarts once every node is back")
        if attempt <= self.sup.restart_attempts:
            self.console.print(
                f"[red]✗[/] {why}. vLLM on the head is stopped (its stages cannot run without "
                "every node) and the proxy answers 503 with Retry-After until the group is whole "
                f"again; restart {attempt}/{self.sup.restart_attempts}")
        # Its stages' partner is gone: nothing left to finish, and every request to it would
        # hang until it is stopped. The proxy's 503s begin once it is.
        child.stop(HEAD_STOP_GRACE_S)
        if attempt > self.sup.restart_attempts:
            raise EngineError(f"{why}; gave up after {attempt - 1} restarts of the group; logs: "
                              f"{child.log_path} and each node's --log-dir")
        told: set[int] = set()
        while missing := self.hub.missing():
            for rank in set(missing) - told:
                self.console.print(f"  waiting for node {rank} to join the node link again")
            if set(missing) != told:
                self.status.write("node_down", f"{gone}: waiting for {nodes_named(missing)} "
                                  f"of {self.group.identity.nodes} to rejoin the group")
            told = set(missing)
            if supervise.wait_until(lambda: False, 1.0, interval_s=0.2,
                                    abort=lambda: self.guard.stopping) or self.guard.stopping:
                return
        delay = self.sup.backoff_s[min(attempt - 1, len(self.sup.backoff_s) - 1)]
        supervise.wait_until(lambda: False, delay, interval_s=0.1,
                             abort=lambda: self.guard.stopping)
        if self.guard.stopping:
            return
        self.hub.set_epoch(self.hub.epoch + 1)
        self.status.write("restarting", f"the {self.group.identity.nodes}-node engine group is "
                          f"restarting (restart {attempt} of {self.sup.restart_attempts}; {gone})")
        child.start()
        self._await_engine(0, self.spec.replicas[0], retried=True)
        self.status.clear()

    def stop_others(self) -> None:
        left = self.hub.stop_nodes("the head is stopping", NODES_STOP_WAIT_S)
        self.hub.close()
        if left:
            self.console.print(f"[yellow]![/] node(s) {', '.join(map(str, left))} did not confirm "
                               f"within {NODES_STOP_WAIT_S:.0f}s that their vLLM share stopped; "
                               "check them")
        else:
            self.console.print("Every other node stopped its vLLM share.")


def nodes_named(ranks: Iterable[int]) -> str:
    """Pure: 'node 1' or 'nodes 1, 2'."""
    listed = sorted(ranks)
    return ("node " if len(listed) == 1 else "nodes ") + ", ".join(map(str, listed))


class StatusFile:
    """Why the head's engine is down on purpose, for the proxy's 503s (server/enginestatus.py):
    replaced whole by a rename, so the proxy never reads half of it. What is written is shown
    to clients: ranks and counts only."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, state: str, message: str) -> None:
        self._put({"state": state, "message": message})

    def clear(self) -> None:
        self._put({})

    def _put(self, data: dict[str, str]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.path)
        except OSError:
            pass  # the proxy then answers its generic 503: nothing else depends on it


def group_port(group: Group) -> str:
    return f"{group.master_addr}:{group.link_port}"


def run_head(spec: LaunchSpec, sup: Supervision, console: Console, group: Group) -> int:
    runner = HeadRunner(spec, sup, console, group)
    return run_with(runner, spec, console, before_engines=runner.stop_others)


class NodeRunner:
    """A node other than the head: its share of vLLM, headless, no proxy."""

    def __init__(self, replica: ReplicaSpec, sup: Supervision, console: Console,
                 group: Group) -> None:
        self.replica, self.sup, self.console, self.group = replica, sup, console, group
        self.guard = SignalGuard()
        self.child = Runner.engine_child(replica, sup)
        self.guard.children = [self.child]
        self.running_epoch = 0
        self.watch = ShareWatch()
        self.broken: str | None = None  # why this epoch's share no longer runs

    def run(self) -> int:
        where = group_port(self.group)
        rank = self.group.identity.node_rank
        told = False

        def waiting(waited: float) -> None:
            nonlocal told
            if self.guard.stopping:
                raise StopRequested
            if not told:
                self.console.print(f"Waiting for the head's node link at {where}…")
                told = True

        link = nodelink.HeadLink.join(self.group.master_addr, self.group.link_port,
                                      self.group.identity, self.group.secret,
                                      self.sup.join_timeout_s, waiting)
        self.console.print(f"[green]✓[/] joined the head at {where} as node {rank} of "
                           f"{self.group.identity.nodes}")
        try:
            return self._follow(link)
        finally:
            link.close()
            self._stop_share()

    def _follow(self, link: nodelink.HeadLink) -> int:
        while not self.guard.stopping:
            for msg in link.messages(0.5):
                if "lost" in msg:
                    self._stop_share()
                    raise EngineError(f"{msg['lost']}: stopped this node's vLLM share; start "
                                      "this node again once the head runs")
                if "stop" in msg:
                    self.console.print(f"The head asked every node to stop ({msg['stop']}).")
                    return 0
                epoch = msg.get("epoch")
                if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch > 0:
                    link.epoch = epoch
            if link.epoch != self.running_epoch and link.epoch > 0 and not self.guard.stopping:
                self._start_share(link.epoch)
            if self.broken is None:
                self.broken = (self.watch.lost(self.child) if self.child.alive()
                               else exit_description(self.child))
            link.report(self.broken is None, self.broken or "")
        return 0

    def _start_share(self, epoch: int) -> None:
        if self.running_epoch:
            self.console.print(f"The head restarted vLLM (epoch {epoch}): restarting this "
                               "node's share")
        self.child.stop(STOP_GRACE_S)
        self.child.start()
        self.watch, self.broken = ShareWatch(), None
        self.running_epoch = epoch
        self.console.print(f"vLLM share started (epoch {epoch}); log: {self.child.log_path}")

    def _stop_share(self) -> None:
        if self.child.proc is not None and not self.child.stop(STOP_GRACE_S + 10.0):
            self.console.print("[yellow]![/] this node's vLLM share was still exiting after "
                               "SIGKILL")


def run_node(replica: ReplicaSpec, sup: Supervision, console: Console, group: Group) -> int:
    runner = NodeRunner(replica, sup, console, group)
    with runner.guard.installed():
        try:
            code = runner.run()
        except StopRequested:  # stopped while still looking for the head
            code = 0
    console.print("Stopped: this node's vLLM share exited, no process left behind.")
    return code


def group_of(replica: ReplicaSpec) -> Group:
    cmd = replica.command
    place = cmd.place
    assert place is not None, "a group's engine command has its place"
    ident = nodelink.NodeIdentity(nodes=place.nodes, node_rank=place.rank,
                                  model=cmd.served_name or cmd.model, tp=cmd.tp, pp=cmd.pp,
                                  max_model_len=cmd.max_model_len)
    return Group(ident, place.master_addr, place.master_port)


def run_group(spec: LaunchSpec, sup: Supervision, console: Console) -> int:
    """This node's part of the group: the head's (vLLM share and proxy) or another's."""
    (replica,) = spec.replicas  # a multi-node plan has one replica, spread over the nodes
    group = group_of(replica)
    secret = nodesecret.resolve(group.identity.node_rank, sup.node_secret_file, os.environ,
                                default_cache_dir(os.environ))
    group = replace(group, secret=secret.value)
    if secret.written:
        console.print(f"Node secret: wrote a new one to {secret.where} (mode 600): every other "
                      "node needs it, as that file there (or --node-secret-file PATH, or "
                      f"{nodesecret.SECRET_ENV})")
    else:
        console.print(f"Node secret: from {secret.where}")
    if group.identity.node_rank == 0:
        return run_head(spec, sup, console, group)
    return run_node(replica, sup, console, group)
