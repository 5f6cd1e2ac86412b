"""Child processes of `launcher serve`: started in their own process group, watched, stopped.

Every child (vLLM and its workers, the proxy) gets its own session, so one signal to the group
reaches the whole tree, including the engine-core and worker processes vLLM forks. On Linux the
children are also told to die with the launcher (PR_SET_PDEATHSIG), so even a SIGKILL of the
launcher leaves no vLLM holding GPU memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import LauncherError, PortInUseError

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec; failures must not stop the exec.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                list(self.argv),
                env=dict(self.env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, grace_s: float) -> bool:
        """SIGTERM the whole group, wait up to ``grace_s``, then SIGKILL what is left.

        True when no process of the group is left. GPU workers killed mid-teardown can take
        seconds more to go (the driver frees their memory first), so the caller can say so.
        """
        if self.proc is None:
            return True
        self.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and group_alive(self.proc.pid):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.1)
            if self.proc.poll() is not None and not group_alive(self.proc.pid):
                break
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return wait_group_gone(self.proc.pid, 15.0)

    def log_tail(self, max_bytes: int = 200_000) -> str:
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - max_bytes))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A group whose only members are zombies still answers signal 0; look for live members.
    return any(_pgid_of(pid) == pgid and not _is_zombie(pid) for pid in _all_pids())


def group_members(pgid: int) -> dict[int, str]:
    """The live processes of group ``pgid``: pid -> command line (vLLM retitles its engine
    core and workers, e.g. ``VLLM::Worker_PP1``)."""
    found = {}
    for pid in _all_pids():
        if _pgid_of(pid) != pgid or _is_zombie(pid):
            continue
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        found[pid] = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.05)
    return not group_alive(pgid)


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces; fields after it are fixed.
    return raw[raw.rfind(")") + 2 :].split()


def _pgid_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[2]) if fields else None


def _is_zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is None or fields[0] in ("Z", "X")


def _bind_address(host: str, port: int, option: str = "--host") -> tuple[int, tuple[Any, ...]]:
    """(address family, address) to bind ``host`` with: IPv4 or IPv6 (``::``), or a name."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise LauncherError(
            f"{option} {host}: not an address or a name this machine can resolve "
            f"({getattr(exc, 'strerror', None) or exc}); pass an address of this machine, e.g. "
            "127.0.0.1 or 0.0.0.0"
        ) from exc
    return family, addr


def check_port_free(host: str, port: int) -> None:
    """Fail early, with the fix, when the port the user asked for is taken (or the host or
    port cannot be bound at all: a name that does not resolve, another machine's address)."""
    family, addr = _bind_address(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As the proxy's own server does: connections it closed linger in TIME_WAIT for a minute
        # after a restart, and must not make a free port look taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(
                    f"port {port} on {host} is already in use: stop the program using it "
                    f"(`ss -ltnp 'sport = :{port}'` shows which) or pass --port with another"
                ) from exc
            if exc.errno == errno.EACCES:
                raise LauncherError(
                    f"port {port} needs root (ports below 1024 are privileged): pass --port "
                    "8000 or another above 1023"
                ) from exc
            raise LauncherError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}): pass --host with an "
                "address of this machine (127.0.0.1, 0.0.0.0)"
            ) from exc


def free_port(host: str = "127.0.0.1", option: str = "--host") -> int:
    family, addr = _bind_address(host, 0, option)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind(addr)
        port: int = sock.getsockname()[1]
        return port


def reachable_host(bind: str) -> str:
    """Where to connect to something listening on ``bind``: loopback for a wildcard address."""
    return "127.0.0.1" if bind in ("0.0.0.0", "::") else bind


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    *,
    interval_s: float = 0.5,
    abort: Callable[[], bool] = lambda: False,
    tick: Callable[[], None] = lambda: None,
) -> bool:
    """Poll ``predicate`` until true; False on timeout or when ``abort`` says to stop waiting."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if abort():
            return False
        tick()
        time.sleep(interval_s)
    return predicate()
