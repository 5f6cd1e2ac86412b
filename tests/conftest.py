"""Session fixtures: the real stack (vLLM CPU engine + proxy) started once, through the launcher.

`stack` runs `launcher serve` exactly as a user does (embedded tiny model, free ports), waits until
the proxy reports ready, and at the end sends SIGTERM and checks that nothing is left running.
Setting TOPOSERVE_TEST_VLLM_URL reuses an engine that is already up (for development: starting
vLLM costs over a minute on two cores) and starts only the proxy in front of it.

The start is begun as soon as the tests are collected, when any selected test uses `stack`, and
the modules that use it run last: the engine's minute of start-up (mostly one process importing
at a time) then overlaps the tests that do not need it, on the second core, instead of being
waited for. Their order inside a module is kept (module fixtures are set up once).

Other slow starts (a module's own engine shape, a whole `launcher tune`) are begun the same way,
one after another once the stack is up (tests/support/early.py); their modules run after the
pure ones and before the stack's, so no other engine is alive while the stack's tests run.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

from launcher.engine.supervise import free_port, http_ok
from tests.support import early

# Hypothesis' default 200 ms deadline per example measures the machine, not the code: on two
# loaded cores a slow example fails as "flaky". Tests assert behaviour; speed is benchmarked.
settings.register_profile("toposerve", deadline=None)
settings.load_profile("toposerve")

# The vLLM a GPU plan is for (engine/detect.served_vllm): the release the tests' GPU figures
# assume (the lent H200 and H100's 0.26), not the CPU build installed here, which leaves a GPU
# engine's unknown and plans it by the conservative rule. tests/launcher/test_cudagraph_rule.py
# plans other releases explicitly; the golden harness pins the same (tests/launcher/golden.py).
os.environ.setdefault("TOPOSERVE_VLLM_VERSION", "0.26.0")

REPO = Path(__file__).resolve().parents[1]
TOPOLOGIES = REPO / "tests" / "fixtures" / "topologies"
STACK_START_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Stack:
    vllm_url: str
    proxy_url: str
    model: str
    model_path: str
    launcher_pid: int | None
    log_path: Path
    # The key `launcher serve` gave vLLM (its /v1 routes refuse requests without it); the
    # proxy holds it, a test that talks to the engine directly sends it.
    engine_key: str | None = None
    # The stack's own TOPOSERVE_CACHE (None: an engine reused from TOPOSERVE_TEST_VLLM_URL):
    # no engine-step timing kept in it, so the stack's serve times its engine as a first serve
    # on a machine does, and keeps the record there.
    cache: Path | None = None

    @property
    def engine_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.engine_key}"} if self.engine_key else {}


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if http_ok(url):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"stack exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        time.sleep(1.0)
    raise RuntimeError(f"stack not ready after {timeout_s:.0f}s:\n{log.read_text()[-4000:]}")


def _served_model(base: str, key: str | None) -> str:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    req = urllib.request.Request(f"{base}/v1/models", headers=headers)
    with urllib.request.urlopen(req, timeout=5) as resp:
        return str(json.load(resp)["data"][0]["id"])


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    from launcher.model.tinymodel import ensure_tiny_model

    return str(ensure_tiny_model())


@dataclass(frozen=True)
class _Launch:
    """The stack's processes as started (at collection, or by the fixture)."""

    proc: subprocess.Popen[bytes]
    proxy_port: int
    vllm_url: str
    key: str | None
    reuse: str | None
    log: Path
    cache: Path | None = None


_early: list[_Launch] = []  # started at collection, not yet taken by the fixture


def _launch(logs: Path) -> _Launch:
    proxy_port = free_port()
    reuse = os.environ.get("TOPOSERVE_TEST_VLLM_URL")
    key = None if reuse else secrets.token_urlsafe(16)
    if reuse:
        argv = [sys.executable, "-m", "server", "--upstream", reuse, "--port", str(proxy_port)]
        vllm_url = reuse.rstrip("/")
    else:
        engine_port = free_port()
        argv = [sys.executable, "-m", "launcher", "serve", "--port", str(proxy_port),
                "--engine-port", str(engine_port), "--log-dir", str(logs), "--grace", "10"]
        vllm_url = f"http://127.0.0.1:{engine_port}"
    log = logs / "launcher.log"
    # Development mode opens vLLM's /pause and /resume, with which a test fixes the order of
    # events between a client and the engine instead of racing the engine's speed.
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    if key:
        env["TOPOSERVE_ENGINE_API_KEY"] = key
    cache = None if reuse else _first_serve_cache(logs / "cache")
    if cache is not None:
        env["TOPOSERVE_CACHE"] = str(cache)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True, env=env)
    return _Launch(proc, proxy_port, vllm_url, key, reuse, log, cache)


def _first_serve_cache(root: Path) -> Path:
    """A cache as a first serve here finds it: the session's embedded model and model shapes
    (pure functions of their inputs, not rebuilt), no timing of this machine's engine."""
    from launcher.model.tinymodel import default_cache_dir

    shared = default_cache_dir(os.environ)
    root.mkdir(parents=True)
    for kept in ("models", "shapes"):
        (shared / kept).mkdir(parents=True, exist_ok=True)
        (root / kept).symlink_to(shared / kept)
    return root


def _uses_stack(item: pytest.Item) -> bool:
    return "stack" in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    late = {str(item.path) for item in items if _uses_stack(item)}
    own = {str(item.path) for item in items if early.wanted_by(item)}
    # stable: file order kept otherwise
    items.sort(key=lambda item: 2 if str(item.path) in late else int(str(item.path) in own))


def _ready_or_gone(launch: _Launch) -> None:
    """Wait (in the background) until the stack answers or has stopped; the stack's fixture
    reports a failed start, not the starts queued after it."""
    deadline = time.monotonic() + STACK_START_TIMEOUT_S
    url = f"http://127.0.0.1:{launch.proxy_port}/ready"
    while time.monotonic() < deadline and launch.proc.poll() is None and not http_ok(url):
        early.pause(1.0)


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    # the factory behind the tmp_path_factory fixture (pytest sets it at configure time)
    factory: pytest.TempPathFactory = session.config._tmp_path_factory  # type: ignore[attr-defined]
    if any(_uses_stack(item) for item in session.items):
        _early.append(_launch(factory.mktemp("stack")))
    keys = list(dict.fromkeys(key for item in session.items for key in early.wanted_by(item)))
    if keys:
        from launcher.model.tinymodel import ensure_tiny_model

        ensure_tiny_model()  # here, not in a start beside the tests (it may have to build it)
    stack = _early[0] if _early else None
    early.schedule(keys, factory.mktemp,
                   after=(lambda: _ready_or_gone(stack)) if stack is not None else None)


def pytest_sessionfinish() -> None:
    early.end_untaken()
    # a start the fixture never took (the run stopped before the first test that uses it)
    for launch in _early:
        if launch.proc.poll() is None:
            os.killpg(launch.proc.pid, signal.SIGKILL)
        launch.proc.wait()


@pytest.fixture(scope="session")
def stack(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    launch = _early.pop() if _early else _launch(tmp_path_factory.mktemp("stack"))
    proc, proxy_port, vllm_url, key, reuse, log = (
        launch.proc, launch.proxy_port, launch.vllm_url, launch.key, launch.reuse, launch.log)
    if key:
        # loadgen pointed at the engine directly reads its key from here, as a user would
        # export it; the proxy (no keys of its own) drops a client's key and sends its own.
        # Set only while the stack is in use: tests before it run without a key, as before.
        os.environ["TOPOSERVE_API_KEY"] = key
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    try:
        _wait_ready(f"{proxy_url}/ready", proc, log, STACK_START_TIMEOUT_S)
        yield Stack(vllm_url, proxy_url, _served_model(vllm_url, key), tiny_model_path,
                    None if reuse else proc.pid, log, key, launch.cache)
    finally:
        if key:
            os.environ.pop("TOPOSERVE_API_KEY", None)
        serving = processes_serving(proxy_port, *([] if reuse else [vllm_url.rsplit(":", 1)[1]]))
        groups = {pgid for pgid, _ in serving}
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # What a user checks after Ctrl-C: nothing of the stack may still run, including the
        # engine-core and worker processes vLLM forks into the same process group.
        left = [cmd for pgid, cmd in live_processes() if pgid in groups]
        assert not left, f"left running after SIGTERM to the launcher: {left}"


def live_processes() -> list[tuple[int, str]]:
    """(process group, command line) of every live process."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            found.append((int(fields[2]), " ".join(a.decode(errors="replace") for a in argv)))
    return found


def processes_serving(*ports: int | str) -> list[tuple[int, str]]:
    """(process group, command line) of live processes started with ``--port P``."""
    wanted = {f"--port {p} " for p in ports}
    return [(g, cmd) for g, cmd in live_processes() if any(w in cmd + " " for w in wanted)]
