"""More than one proxy process on one port (``--workers N``).

One process relays every stream on one event loop, so a burst of requests is answered one
after another: at 256 concurrent streams the last one waits for the Python work of the 255
before it (benchmarks/proxy_overhead.py, docs/benchmarks-proxy.md). With N workers each has its
own listening socket on the same port (``SO_REUSEPORT``): the kernel spreads new connections
over them by a hash of the connection's addresses, so a burst is split N ways, where a single
socket shared by N processes would let whichever wakes first accept the whole backlog (libuv
accepts until the queue is empty).

The parent binds every socket (a busy port is one error line before anything forks), forks the
workers, and from then on only waits: SIGTERM or SIGINT is passed on to each worker as SIGTERM
(each drains its own streams), and a worker that ends on its own stops the others and the
parent exits 1 rather than serving on with fewer processes than configured. Workers die with
the parent (``PR_SET_PDEATHSIG``) so that a killed parent leaves no process holding the port.

What is per worker and what is global (docs/proxy.md, "Workers"): the limits are global totals
split evenly (``split_limits``); health checks, replica routing and prefix affinity are each
worker's own; /metrics answers for all workers (``PeerMetrics``: each worker serves its
registry on a Unix socket in a private directory, and a scrape of any worker merges them,
server.metrics.merge_worker_metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from server.config import ProxyConfig

log = logging.getLogger("toposerve")

BACKLOG = 2048  # uvicorn's default
PEER_TIMEOUT_S = 2.0  # a worker too busy to hand over its metrics within this is left out
PEER_MAX_BYTES = 32 * 1024 * 1024
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Seat:
    """Which of ``count`` workers this process is, and where the workers meet."""

    index: int
    count: int
    rendezvous: str  # a directory only this user can enter: <index>.sock per worker

    def socket_path(self, index: int) -> str:
        return str(Path(self.rendezvous) / f"{index}.sock")

    def peers(self) -> list[str]:
        return [self.socket_path(i) for i in range(self.count) if i != self.index]


def split_limits(cfg: ProxyConfig, count: int) -> ProxyConfig:
    """One worker's share of the global limits: --max-in-flight, --max-queue and
    --max-connections divided evenly (rounded up, so a limit below ``count`` still lets every
    worker serve one). Connections are spread by a hash, not by load, so one worker can refuse
    while another has room; the sum never exceeds the limit by more than ``count - 1``."""
    if count <= 1:
        return cfg
    return dataclasses.replace(
        cfg, max_in_flight=math.ceil(cfg.max_in_flight / count),
        max_queue=math.ceil(cfg.max_queue / count),
        max_connections=(None if cfg.max_connections is None
                         else math.ceil(cfg.max_connections / count)))


def listeners(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening sockets on one address, the first choosing the port when it is 0."""
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    made: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            made.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if len(made) > 1:  # the port the first one got
                address = (address[0], made[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(BACKLOG)
    except OSError:
        for sock in made:
            sock.close()
        raise
    return made


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def supervise(sockets: list[socket.socket], serve: Callable[[Seat, socket.socket], None],
              stop_grace_s: float) -> int:
    """Fork one worker per socket, each running ``serve``; return the exit status for the
    parent once all have ended."""
    rendezvous = tempfile.mkdtemp(prefix="toposerve-workers-")  # mode 0700
    parent = os.getpid()
    children: dict[int, int] = {}
    try:
        for index, sock in enumerate(sockets):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    _die_with_parent(parent)
                    for other in sockets:
                        if other is not sock:
                            other.close()
                    serve(Seat(index, len(sockets), rendezvous), sock)
                    code = 0
                except BaseException as exc:  # a worker never returns into the parent's loop
                    if not isinstance(exc, SystemExit | KeyboardInterrupt):
                        log.exception("worker %d failed", index)
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            children[pid] = index
        for sock in sockets:
            sock.close()
        return _wait(children, stop_grace_s)
    finally:
        _kill_all(children)  # any still running: the parent is leaving
        shutil.rmtree(rendezvous, ignore_errors=True)


def _wait(children: dict[int, int], stop_grace_s: float) -> int:
    stopping = False
    status = 0

    def stop(signum: int = signal.SIGTERM, frame: object = None) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            signal.signal(signal.SIGALRM, lambda *_: _kill_all(children))
            signal.alarm(max(1, math.ceil(stop_grace_s)))  # drained or not, then killed
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while children:
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            break
        index = children.pop(pid, None)
        if index is None:
            continue
        code = os.waitstatus_to_exitcode(raw)
        if not stopping:
            log.error("proxy worker %d (pid %d) ended with status %d: stopping the other "
                      "workers", index, pid, code)
            status = 1
            stop()
    signal.alarm(0)
    return status


def _kill_all(children: dict[int, int]) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class PeerMetrics:
    """This worker's registry served to its siblings, and theirs read for a scrape."""

    def __init__(self, seat: Seat, exposition: Callable[[], bytes]) -> None:
        self.seat = seat
        self._exposition = exposition
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        path = self.seat.socket_path(self.seat.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._server = await asyncio.start_unix_server(self._answer, path=path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(self._exposition())
            await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def read_peers(self) -> list[str]:
        """The siblings' exposition texts; one that does not answer in time is left out."""
        texts = await asyncio.gather(*(_read_peer(p) for p in self.seat.peers()))
        return [t for t in texts if t is not None]


async def _read_peer(path: str) -> str | None:
    try:
        async with asyncio.timeout(PEER_TIMEOUT_S):
            reader, writer = await asyncio.open_unix_connection(path)
            try:
                data = await reader.read(PEER_MAX_BYTES + 1)
                chunks = [data]
                size = len(data)
                while data and size <= PEER_MAX_BYTES:
                    data = await reader.read(PEER_MAX_BYTES + 1 - size)
                    chunks.append(data)
                    size += len(data)
            finally:
                writer.close()
    except (TimeoutError, OSError):
        return None
    if size > PEER_MAX_BYTES:
        return None
    return b"".join(chunks).decode("utf-8", "replace")
