"""Stamps of vLLM's front end and engine core on CLOCK_MONOTONIC (run.sh loads it as
sitecustomize into the API server and the engine core it spawns; H75_EV: the record's folder).

Each process appends (time, event, ...) rows to ev-PID.jsonl. API server: a request's ASGI entry
(``app``, with the client's x-idx), body read, create_completion, AsyncLLM.add_request in and out,
the IPC to the engine core in and out (``zmq0``/``zmq1``), the output processor's call with the
requests whose first output it holds (``proc``), the stream's first two bodies. Engine core:
each request added, each schedule (tokens, new requests), each execute_model, which sleeps to
H75_STEP_MS + H75_US_PER_TOKEN x its tokens (a GPU-like step on a CPU engine)."""

import atexit
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
    _ev: list[tuple] = []
    _mono = time.monotonic

    def ev(*a):
        _ev.append((_mono(), *a))

    def _flush():
        if not _ev:
            return
        with open(os.path.join(EVDIR, f"ev-{os.getpid()}.jsonl"), "a") as f:
            while _ev:
                f.write(json.dumps(_ev.pop(0)) + "\n")

    def _flusher():
        while True:
            time.sleep(2.0)
            with contextlib.suppress(Exception):
                _flush()

    threading.Thread(target=_flusher, daemon=True).start()
    atexit.register(_flush)
    CUR = contextvars.ContextVar("vfo_key", default=None)
    KEYS = itertools.count()
    RID: dict = {}

    def patch_app(m):
        orig = m.build_app

        def build_app(*a, **k):
            app = orig(*a, **k)

            class Stamped:
                def __init__(self, app):
                    self.app = app

                async def __call__(self, scope, receive, send):
                    if scope["type"] != "http" or not scope["path"].endswith("/completions"):
                        return await self.app(scope, receive, send)
                    key = next(KEYS)
                    CUR.set(key)
                    ev("app", key, int(dict(scope["headers"]).get(b"x-idx", b"-1")))
                    n = [0]

                    async def rcv():
                        msg = await receive()
                        if msg.get("type") == "http.request" and not msg.get("more_body"):
                            ev("body", key)
                        return msg

                    async def snd(msg):
                        if msg["type"] == "http.response.body" and msg.get("body"):
                            n[0] += 1
                            if n[0] <= 2:
                                ev(f"send{n[0]}", key)
                        return await send(msg)

                    await self.app(scope, rcv, snd)
                    ev("done", key)
                    return None

            if getattr(app, "middleware_stack", None) is not None:
                app.middleware_stack = Stamped(app.middleware_stack)
            else:
                bms = app.build_middleware_stack
                app.build_middleware_stack = lambda: Stamped(bms())
            return app

        m.build_app = build_app

    def patch_serving(m):
        cls = m.OpenAIServingCompletion
        orig = cls.create_completion

        async def create_completion(self, *a, **k):
            ev("create", CUR.get())
            return await orig(self, *a, **k)

        cls.create_completion = create_completion

    def patch_async_llm(m):
        cls = m.AsyncLLM
        orig = cls.add_request

        async def add_request(self, *a, **k):
            ev("add0", CUR.get())
            r = await orig(self, *a, **k)
            ev("add1", CUR.get())
            return r

        cls.add_request = add_request

    def patch_core_client(m):
        cls = m.AsyncMPClient
        orig = cls.add_request_async

        async def add_request_async(self, request):
            key = CUR.get()
            RID[request.request_id] = key
            ev("zmq0", key)
            r = await orig(self, request)
            ev("zmq1", key)
            return r

        cls.add_request_async = add_request_async

    SEEN: set = set()

    def patch_outproc(m):
        cls = m.OutputProcessor
        orig = cls.process_outputs

        def process_outputs(self, outs, *a, **k):
            firsts = [RID.get(o.request_id) for o in outs if o.request_id not in SEEN]
            SEEN.update(o.request_id for o in outs)
            ev("proc", len(outs), firsts)
            return orig(self, outs, *a, **k)

        cls.process_outputs = process_outputs

    def patch_sched(m):
        cls = m.Scheduler
        orig = cls.schedule

        def schedule(self, *a, **k):
            t0 = _mono()
            out = orig(self, *a, **k)
            ev("sched", t0, out.total_num_scheduled_tokens,
               [r.req_id for r in out.scheduled_new_reqs])
            return out

        cls.schedule = schedule

    def patch_core(m):
        cls = m.EngineCore
        orig = cls.add_request

        def add_request(self, request, *a, **k):
            ev("eadd", request.request_id)
            return orig(self, request, *a, **k)

        cls.add_request = add_request

    US = float(os.environ.get("H75_US_PER_TOKEN", "0"))
    FIX = float(os.environ.get("H75_STEP_MS", "0"))

    def patch_runner(m):
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
            ev("exec", t0, tok)
            return r

        cls.execute_model = execute_model

    TARGETS = {
        "vllm.entrypoints.launchers.app": patch_app,
        "vllm.entrypoints.openai.completion.serving": patch_serving,
        "vllm.v1.engine.async_llm": patch_async_llm,
        "vllm.v1.engine.core_client": patch_core_client,
        "vllm.v1.engine.output_processor": patch_outproc,
        "vllm.v1.core.sched.scheduler": patch_sched,
        "vllm.v1.engine.core": patch_core,
        "vllm.v1.worker.cpu_model_runner": patch_runner,
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
                    ev("patched", _n)
                except Exception as e:  # a vLLM without the function: said in the record
                    ev("patchfail", _n, repr(e))

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())
