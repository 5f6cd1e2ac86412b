"""What the multi-node tests start and look at: `launcher serve` as a user runs it, and the
process table read from /proc (never our own logs)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.engine.detect import detect_engine
from launcher.engine.supervise import free_port
from launcher.errors import EngineError
from tests.conftest import REPO

MAX_MODEL_LEN = "1024"  # a 512+64 request fits; small, so the KV cache and start-up stay small

def _cpu_build() -> bool:
    try:
        return detect_engine().is_cpu_build
    except EngineError:
        return False


cpu_build_only = pytest.mark.skipif(
    not _cpu_build(),
    reason="the CPU build of vLLM's behaviour; on GPUs vLLM places the stages on Ray instead")


def free_master_port() -> int:
    """A free port whose next one is free too: the node link listens on the master port + 1
    (with engines of other tests alive, a free port's neighbour is often taken)."""
    while True:
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def serve(tmp: Path, *args: str, env: Mapping[str, str] | None = None
          ) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    argv = [sys.executable, "-m", "launcher", "serve", "--port", str(port), "--log-dir",
            str(tmp / "logs"), "--max-model-len", MAX_MODEL_LEN, "--grace", "10",
            "--ready-timeout", "600", *args]
    with (tmp / "launcher.out").open("wb") as out, (tmp / "launcher.err").open("wb") as err:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=err, env=env)
    return proc, port


@dataclass(frozen=True)
class Proc:
    pid: int
    pgid: int
    title: str  # its command line, as vLLM retitles its engine core and workers


def live() -> dict[int, tuple[int, Proc]]:
    """Every live process, from /proc: pid -> (parent pid, process)."""
    found = {}
    for pid_text in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid_text}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{pid_text}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            pid = int(pid_text)
            found[pid] = (int(fields[1]), Proc(pid, int(fields[2]),
                                               cmd.decode(errors="replace").strip()))
    return found


def descendants(root: int) -> list[Proc]:
    procs = live()
    tree = {root}
    while more := {pid for pid, (ppid, _) in procs.items() if ppid in tree} - tree:
        tree |= more
    return [procs[pid][1] for pid in sorted(tree - {root}) if pid in procs]


def still_alive(procs: list[Proc]) -> list[Proc]:
    now = {p for _, p in live().values()}
    return [p for p in procs if p in now]


