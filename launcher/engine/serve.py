"""`launcher serve`: plan, start vLLM (one process group per replica) and the proxy, supervise.

Start-up: the port is checked first, then the model, topology and plan; the engines start, a
progress line tells what they are doing, and a failed start is recognised from the log (see
failures.py) and retried once with the known-safe fallback. Afterwards an engine that dies is
restarted with backoff while the proxy answers 503 with Retry-After. The first SIGINT/SIGTERM
drains: the proxy stops accepting and finishes what it has for up to ``grace_s``, then the engines
stop; a second signal kills everything at once.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType

from rich.console import Console

from launcher.engine import failures, kvrefusal, progress, supervise, vllm_keyguard
from launcher.engine.detect import ENGINE_CMD_VAR, detect_engine, engine_argv, engine_prefix
from launcher.engine.failures import Diagnosis
from launcher.engine.launchspec import LaunchSpec, ReplicaSpec
from launcher.errors import EngineError
from topocommon import keyfile

ENGINE_KEY_ENV = "VLLM_API_KEY"  # vLLM checks it on /v1 routes (not /health, /metrics)
UPSTREAM_KEY_ENV = "TOPOSERVE_UPSTREAM_API_KEY"  # what the proxy sends its engines (server/config)


@dataclass(frozen=True)
class Supervision:
    ready_timeout_s: float = 900.0
    restart_attempts: int = 5
    backoff_s: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
    # An engine that has stayed up this long has its restart budget given back.
    healthy_reset_s: float = 300.0
    grace_s: float = 30.0
    # A node other than the head: how long to look for the head's node link before saying so.
    join_timeout_s: float = 120.0
    # A node of a group: the node link's secret file (nodesecret.py; None: the default one).
    node_secret_file: Path | None = None
    log_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "toposerve" / "logs")


class StopRequested(Exception):
    """The user asked to stop (first SIGINT/SIGTERM) while we were waiting for something."""


class StopCut(BaseException):
    """The first SIGINT/SIGTERM, raised where it landed inside :meth:`SignalGuard.cutting`: what
    ran there (blocked in a socket read or not) ends at once. A BaseException, so that no
    ``except Exception`` on its way out takes it for a failure of what it cut."""


Cutting = Callable[[], AbstractContextManager[None]]


class SignalGuard:
    """First SIGINT/SIGTERM asks for a graceful stop; a second one kills every child at once.

    The stop is a flag that the waits poll (none of them waits long between looks), except
    inside :meth:`cutting`, where it is raised as :class:`StopCut` from the handler, so that a
    long step of ours that does not poll (serve's timing of its engine: HTTP requests that
    take seconds each) ends at once rather than when it would have (up to ~35 s later, past a
    supervisor's grace period)."""

    def __init__(self) -> None:
        self.stopping = False
        self.cuttable = False
        self.children: list[supervise.Child] = []

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:
            for child in self.children:
                child.signal_group(signal.SIGKILL)
            os._exit(128 + signum)
        self.stopping = True
        if self.cuttable:
            self.cuttable = False  # raised once: the code catching it is not cut in turn
            raise StopCut

    @contextmanager
    def cutting(self) -> Iterator[None]:
        """A stop while inside raises :class:`StopCut` there (one asked before entering raises
        it on entry). Only around work whose partial result is dropped whole: a stop can land
        between any two of its bytecodes."""
        if self.stopping:
            raise StopCut
        self.cuttable = True
        try:
            yield
        finally:
            self.cuttable = False

    @contextmanager
    def installed(self) -> Iterator[SignalGuard]:
        old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)


class Runner:
    """The running stack: engine replicas, the proxy, and the loop that keeps them up."""

    def __init__(self, spec: LaunchSpec, sup: Supervision, console: Console,
                 after_ready: Callable[[Cutting], None] | None = None) -> None:
        self.spec = spec
        self.sup = sup
        self.console = console
        # run once every engine is ready and before the proxy starts, so that nothing it does
        # to the engines (serve's timing of the CPU engine) meets a user's request; given the
        # guard's cutting(), within which a stop ends its long steps at once
        self.after_ready = after_ready
        self.guard = SignalGuard()
        self.engines: list[supervise.Child] = []
        self.proxy: supervise.Child | None = None

    # -- building children -------------------------------------------------------------------

    def _engine_child(self, replica: ReplicaSpec) -> supervise.Child:
        return self.engine_child(replica, self.sup, self.spec.engine_api_key)

    @staticmethod
    def engine_child(replica: ReplicaSpec, sup: Supervision,
                     api_key: str | None = None) -> supervise.Child:
        env = {**os.environ, **replica.env}
        if api_key:
            # Through the environment (argv is readable by every local user); set here, not in
            # the command, so that the printed command never shows it.
            env[ENGINE_KEY_ENV] = api_key
        place = replica.command.place
        prefix = engine_prefix(os.environ, headless=place is not None and place.headless)
        argv = engine_argv(replica.argv, prefix)
        if api_key:
            # vLLM asks its key under /v1 and a few prefixes only (its /invocations generates
            # without it): this asks it everywhere but the probes (vllm_keyguard.py)
            argv += ["--middleware", vllm_keyguard.MIDDLEWARE]
        log = sup.log_dir / f"vllm-{replica.port}.log"
        return supervise.Child(f"vllm:{replica.port}", argv, env, log)

    def _proxy_child(self) -> supervise.Child:
        s = self.spec
        argv = [sys.executable, "-m", "server", "--host", s.host, "--port", str(s.port)]
        for replica in s.replicas:
            argv += ["--upstream", replica.url]
        argv += ["--plan-info", json.dumps(s.plan_info, sort_keys=True)]
        # The proxy drains for as long as the launcher waits for it, and no longer.
        argv += ["--drain-timeout", f"{self.sup.grace_s:g}"]
        argv += list(s.proxy_args)
        env = dict(os.environ)
        if s.engine_api_key:
            env[UPSTREAM_KEY_ENV] = s.engine_api_key
        if s.api_keys:
            # Keys go through the environment, never argv, which any local user can read.
            env[keyfile.KEYS_ENV] = ",".join(s.api_keys)
        return supervise.Child("proxy", argv, env, self.sup.log_dir / f"proxy-{s.port}.log")

    def _all_children(self) -> list[supervise.Child]:
        return [*self.engines, *([self.proxy] if self.proxy else [])]

    # -- start-up ----------------------------------------------------------------------------

    def start(self) -> None:
        if ENGINE_CMD_VAR not in os.environ:
            detect_engine()
        self.engines = [self._engine_child(r) for r in self.spec.replicas]
        self.guard.children = self._all_children()
        for child in self.engines:
            self._truncate_log(child)
            child.start()
        if self.after_ready is not None:
            self._await_engines()
            self.after_ready(self.guard.cutting)
            if self.guard.stopping:
                raise StopRequested
        self.proxy = self._proxy_child()
        self._truncate_log(self.proxy)
        self.proxy.start()
        self.guard.children = self._all_children()
        if self.after_ready is None:  # the proxy starts beside the engines
            self._await_engines()
        self._await_proxy()

    def _await_engines(self) -> None:
        for i, replica in enumerate(self.spec.replicas):
            self._await_engine(i, replica, retried=False)

    @staticmethod
    def _truncate_log(child: supervise.Child) -> None:
        child.log_path.parent.mkdir(parents=True, exist_ok=True)
        child.log_path.write_bytes(b"")

    def _await_engine(self, index: int, replica: ReplicaSpec, *, retried: bool) -> None:
        child = self.engines[index]
        started = time.monotonic()
        seen: list[str] = []
        with self.console.status(f"vLLM ({replica.url}): starting") as status:

            def tick() -> None:
                phase = progress.current_phase(child.log_tail())
                elapsed = time.monotonic() - started
                status.update(f"vLLM ({replica.url}): {phase} … {elapsed:.0f}s")
                # Without a terminal the spinner is invisible: log each new phase once instead.
                if not self.console.is_terminal and phase not in seen:
                    seen.append(phase)
                    self.console.print(f"  vLLM ({replica.url}): {phase} … {elapsed:.0f}s")

            ok = supervise.wait_until(
                lambda: supervise.http_ok(f"{replica.url}/health"),
                self.sup.ready_timeout_s,
                abort=lambda: self.guard.stopping or not child.alive(),
                tick=tick,
            )
        if self.guard.stopping:
            raise StopRequested
        if ok:
            self.console.print(f"[green]✓[/] vLLM ready on {replica.url} "
                               f"({time.monotonic() - started:.0f}s)")
            return
        self._handle_failed_start(index, replica, retried=retried)

    def _handle_failed_start(self, index: int, replica: ReplicaSpec, *, retried: bool) -> None:
        child = self.engines[index]
        log = child.log_tail()
        timed_out = child.alive()
        child.stop(5.0)
        refused = kvrefusal.refusal(log)  # the planned context is more than vLLM's KV holds
        if refused is not None and not timed_out:
            user_len = any(a.startswith("--max-model-len") for a in replica.command.extra_args)
            if refused.retry_len and not retried and not user_len:
                self.console.print(f"[yellow]![/] {refused.explain()}")
                changed = replace(replica, command=replace(
                    replica.command, max_model_len=refused.retry_len))
                self._restart_changed(index, changed)
                return
            raise EngineError(f"vLLM failed to start: {refused.failure()}; "
                              f"full log: {child.log_path}")
        diagnosis = failures.diagnose(log)
        if diagnosis and diagnosis.retryable and not retried:
            self._retry_with_fallback(index, replica, diagnosis)
            return
        raise EngineError(self._failure_message(child, log, diagnosis, timed_out))

    def _retry_with_fallback(self, index: int, replica: ReplicaSpec, diag: Diagnosis) -> None:
        self.console.print(f"[yellow]![/] {diag.sentence}.\n  Retrying once with: "
                           f"{' '.join(diag.changes())}")
        self._restart_changed(index, replace(replica, command=diag.apply(replica.command)))

    def _restart_changed(self, index: int, changed: ReplicaSpec) -> None:
        self.engines[index] = self._engine_child(changed)
        self.guard.children = self._all_children()
        self._truncate_log(self.engines[index])
        self.engines[index].start()
        self._await_engine(index, changed, retried=True)

    def _failure_message(self, child: supervise.Child, log: str, diagnosis: Diagnosis | None,
                         timed_out: bool) -> str:
        if timed_out:
            head = (f"vLLM did not become ready within {self.sup.ready_timeout_s:.0f}s "
                    "(raise --ready-timeout if the model is large)")
        elif diagnosis:
            head = f"vLLM failed to start: {diagnosis.sentence}"
        else:
            line = failures.last_error_line(log) or f"exit code {child.exit_code()}"
            head = f"vLLM failed to start: {line}"
        return f"{head}; full log: {child.log_path}"

    def _await_proxy(self) -> None:
        proxy = self.proxy
        assert proxy is not None
        # /ready, not /health: the banner must not be printed before the proxy's own health
        # check has seen the engine, or the first request would get a 503.
        url = f"http://{supervise.reachable_host(self.spec.host)}:{self.spec.port}/ready"
        # An engine that dies while the proxy starts is the steady state's to restart: the proxy
        # cannot become ready without it, so waiting on would end in a false "did not start".
        ok = supervise.wait_until(
            lambda: supervise.http_ok(url), 60.0, interval_s=0.2,
            abort=lambda: self.guard.stopping or not proxy.alive() or self._an_engine_died(),
        )
        if self.guard.stopping:
            raise StopRequested
        if not ok and proxy.alive() and self._an_engine_died():
            return
        if not ok:
            line = failures.last_error_line(proxy.log_tail()) or "no error in its log"
            raise EngineError(f"the proxy did not start: {line}; full log: {proxy.log_path}")

    def _an_engine_died(self) -> bool:
        return any(not child.alive() for child in self.engines)

    # -- steady state ------------------------------------------------------------------------

    def supervise_forever(self) -> None:
        attempts = [0 for _ in self.engines]
        up_since = [time.monotonic() for _ in self.engines]
        while not self.guard.stopping:
            time.sleep(0.5)
            for i, child in enumerate(self.engines):
                if child.alive():
                    if time.monotonic() - up_since[i] > self.sup.healthy_reset_s:
                        attempts[i] = 0
                    continue
                if self.guard.stopping:
                    break
                attempts[i] += 1
                self._restart_engine(i, attempts[i])
                up_since[i] = time.monotonic()
            self._restart_proxy_if_dead()

    def _restart_engine(self, index: int, attempt: int) -> None:
        child = self.engines[index]
        if attempt > self.sup.restart_attempts:
            raise EngineError(
                f"vLLM on {self.spec.replicas[index].url} died {attempt - 1} times; giving up. "
                f"Last error: {failures.last_error_line(child.log_tail()) or 'none logged'}; "
                f"full log: {child.log_path}"
            )
        delay = self.sup.backoff_s[min(attempt - 1, len(self.sup.backoff_s) - 1)]
        self.console.print(f"[red]✗[/] vLLM on {self.spec.replicas[index].url} exited "
                           f"(code {child.exit_code()}); restart {attempt}/"
                           f"{self.sup.restart_attempts} in {delay:.0f}s")
        child.stop(2.0)  # reap any worker left in its group
        if supervise.wait_until(lambda: False, delay, interval_s=0.1,
                                abort=lambda: self.guard.stopping):
            return
        if self.guard.stopping:
            return
        child.start()
        self._await_engine(index, self.spec.replicas[index], retried=True)

    def _restart_proxy_if_dead(self) -> None:
        if self.proxy is not None and not self.proxy.alive() and not self.guard.stopping:
            self.console.print(f"[red]✗[/] the proxy exited (code {self.proxy.exit_code()}); "
                               "restarting it")
            self.proxy.start()
            self._await_proxy()

    def shutdown(self, before_engines: Callable[[], None] = lambda: None) -> None:
        """Drain the proxy for up to the grace period, then stop the engines; nothing left.
        ``before_engines`` runs between the two (the head of several nodes stops theirs)."""
        if self.proxy is not None:
            self.console.print(f"Draining in-flight requests (up to {self.sup.grace_s:.0f}s; "
                               "Ctrl-C again to force)…")
            self.proxy.stop(self.sup.grace_s + 5.0)
        before_engines()
        left = [c.proc.pid for c in self.engines if not c.stop(15.0) and c.proc is not None]
        if left:
            # Never claim a clean stop that did not happen: the user may start the next run.
            self.console.print(f"[yellow]![/] vLLM's process group {', '.join(map(str, left))} "
                               "was still exiting after SIGKILL; check `nvidia-smi` before "
                               "starting again")
        else:
            self.console.print("Stopped: proxy and vLLM exited, no process left behind.")


def run(spec: LaunchSpec, sup: Supervision, console: Console,
        after_ready: Callable[[Cutting], None] | None = None) -> int:
    return run_with(Runner(spec, sup, console, after_ready), spec, console)


def run_with(runner: Runner, spec: LaunchSpec, console: Console,
             before_engines: Callable[[], None] = lambda: None) -> int:
    """Start, print the banner, supervise until a signal, and stop everything (one node's runner,
    or the head of several with ``before_engines`` stopping the other nodes' shares)."""
    with runner.guard.installed():
        try:
            runner.start()
            console.print(spec.banner())
            runner.supervise_forever()
        except (StopRequested, StopCut):  # StopCut: a hook that let its cut stop through
            pass
        finally:
            runner.shutdown(before_engines=before_engines)
    return 0
