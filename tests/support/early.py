"""Slow starts (an engine of a test module's own, a whole `launcher tune`) begun in the
background as soon as the tests are collected, one after another, while the tests that need
none run on the other core.

pytest runs one test at a time, so on a two-core machine one core waits while the pure tests
run; a vLLM start (about a minute of imports and loading on two cores) costs next to nothing
there. A test module registers each start with the fixture that takes it::

    early.register(__file__, "pp2", begin_pp2, end_pp2)

    @pytest.fixture(scope="module")
    def pp2(tmp_path_factory): handle = early.take(__file__, "pp2", tmp_path_factory); ...

``begin(tmp)`` starts it and returns once it is ready (raising, with what it printed, when it is
not); ``end(handle)`` stops it. When a selected test uses the fixture, tests/conftest.py queues
``begin`` at collection, in the order the tests will run, and runs those tests after the pure
ones; ``take`` then waits for it (re-raising a failed start in the test that needed it). Without
a queued start (``--collect-only``, a fixture asked again) ``take`` begins it there and then.
A start no test took is ended at session end. ``begin`` runs in a thread beside the tests: what
it starts gets ``environ()``, never os.environ, and absolute paths.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

# A held start (an engine left running for its tests) waits for this much free memory, unless
# its test already asks for it: several idle engines at once must not push a loaded machine
# into the OOM killer.
MIN_FREE_BYTES = 6 * 1024**3


class SessionEnded(RuntimeError):
    """The session ended while a start was still waiting (its process is stopped)."""


@dataclass(frozen=True)
class Start:
    begin: Callable[[Path], Any]
    end: Callable[[Any], None]
    holds: bool  # leaves processes running until its tests are done (an engine), or not


@dataclass
class _Queued:
    start: Start
    future: Future[Any]
    wanted: threading.Event = field(default_factory=threading.Event)


_registry: dict[tuple[str, str], Start] = {}
_queued: dict[tuple[str, str], _Queued] = {}
_executor: ThreadPoolExecutor | None = None
_ended = threading.Event()
_environ: dict[str, str] | None = None


def environ() -> dict[str, str]:
    """The environment as it was when the starts were queued, for what a start runs: a test
    running meanwhile may have changed os.environ for itself (monkeypatch), and a start in
    the background must not pick that up."""
    return dict(os.environ if _environ is None else _environ)


def register(module: str, fixture: str, begin: Callable[[Path], Any],
             end: Callable[[Any], None], *, holds: bool = True) -> None:
    _registry[(str(Path(module).resolve()), fixture)] = Start(begin, end, holds)


def held(module: str, name: str, begin: Callable[[Path], Any], end: Callable[[Any], None],
         *, scope: Literal["function", "module"] = "module") -> Any:
    """Register a start that leaves an engine running for its tests, and the fixture ``name``
    that takes it and ends it after them; the module binds it under that name::

        pp2 = early.held(__file__, "pp2", begin_pp2, end_pp2)
    """
    register(module, name, begin, end)

    @pytest.fixture(scope=scope, name=name)
    def taken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
        started = take(module, name, tmp_path_factory)
        try:
            yield started
        finally:
            end(started)

    return taken


def _skipped(item: pytest.Item) -> bool:
    return any(True for _ in item.iter_markers("skip")) or any(
        bool(m.args[0]) for m in item.iter_markers("skipif")
        if m.args and isinstance(m.args[0], bool))


def wanted_by(item: pytest.Item) -> list[tuple[str, str]]:
    """The registered starts this test takes (none for a test skipped outright)."""
    names = getattr(item, "fixturenames", ())
    if _skipped(item):
        return []
    path = str(Path(str(item.path)).resolve())
    return [key for key in _registry if key[0] == path and key[1] in names]


def pause(seconds: float) -> None:
    """Sleep between polls of a start; a start still waiting at session end stops here."""
    if _ended.wait(seconds):
        raise SessionEnded("the test session ended before this start was ready")


def wait_exit(proc: subprocess.Popen[bytes], limit_s: float, what: str,
              poll_s: float = 1.0) -> None:
    """Wait for a background job's process to exit, pausing between polls (:func:`pause`);
    killed, never left running, when it runs past ``limit_s`` (failing with ``what`` ran past
    it) or the session ends first."""
    deadline = time.monotonic() + limit_s
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, f"{what} ran past {limit_s:g} s"
            pause(poll_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _free_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return MIN_FREE_BYTES


def _run(job: _Queued, tmp: Path, after: Callable[[], None] | None) -> Any:
    if after is not None:
        after()
    while job.start.holds and not job.wanted.is_set() and _free_bytes() < MIN_FREE_BYTES:
        pause(2.0)
    return job.start.begin(tmp)


def schedule(keys: list[tuple[str, str]], mktemp: Callable[[str], Path],
             after: Callable[[], None] | None = None) -> None:
    """Queue the starts of ``keys`` in this order, the first once ``after`` has returned (the
    shared stack's own start, so that two starts do not share the free core)."""
    global _executor, _environ
    if not keys:
        return
    _environ = dict(os.environ)
    _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="early-start")
    for i, key in enumerate(keys):
        job = _Queued(_registry[key], Future())
        tmp = mktemp(key[1])
        job.future = _executor.submit(_run, job, tmp, after if i == 0 else None)
        _queued[key] = job


def take(module: str, fixture: str, factory: pytest.TempPathFactory) -> Any:
    key = (str(Path(module).resolve()), fixture)
    job = _queued.pop(key, None)
    if job is None:
        return _registry[key].begin(factory.mktemp(fixture))
    job.wanted.set()
    return job.future.result()


def end_untaken() -> None:
    """At session end: stop what was begun and never taken; a start still under way stops at
    its next poll."""
    _ended.set()
    if _executor is not None:
        _executor.shutdown(wait=True, cancel_futures=True)
    for job in _queued.values():
        if job.future.done() and not job.future.cancelled() and job.future.exception() is None:
            job.start.end(job.future.result())
    _queued.clear()
