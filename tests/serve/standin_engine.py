"""A stand-in for `vllm serve`, for testing the launcher's supervision without a real engine.

Started by the launcher through TOPOSERVE_ENGINE_CMD. Behaviour comes from the environment:
- STANDIN_STATE: directory where each start appends a line to `starts` (argv and chosen env);
- STANDIN_FAIL=symm-mem: crash at start with vLLM's recorded symmetric-memory signature unless
  the known-safe fallback (VLLM_ALLREDUCE_USE_SYMM_MEM=0 and --compilation-config) is applied;
- STANDIN_FAIL=always: crash at start with an unrecognised error, every time;
- STANDIN_DIE_AFTER=S: on the first start only, exit S seconds after becoming ready;
- STANDIN_RESTART_GATE=PATH: every start after the first waits, not listening, until PATH
  exists (a test lets it listen once it has seen what the wait is for);
- STANDIN_COMPLETION_DELAY=S: each /v1/completions takes S seconds (requests in flight); each
  one's arrival is a line appended to STANDIN_STATE's `completions` before that wait.
Otherwise it serves /health, /v1/models and a minimal non-streamed /v1/completions.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# What vLLM 0.26 printed on an H200 pair with NVLink multicast off (abridged, same key lines).
SYMM_MEM_CRASH = """\
(Worker_TP0 pid=4242) INFO [gpu_model_runner.py] Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 0%
(Worker_TP0 pid=4242) ERROR [multiproc_executor.py] WorkerProc hit an exception.
(Worker_TP0 pid=4242) ERROR Traceback (most recent call last):
(Worker_TP0 pid=4242) ERROR   File "/root/site/torch/distributed/_symmetric_memory/__init__.py", line 1290, in multimem_all_reduce_
(Worker_TP0 pid=4242) ERROR torch.AcceleratorError: CUDA error: an illegal memory access was encountered
(EngineCore_DP0 pid=4100) ERROR [core.py] EngineCore failed to start.
RuntimeError: Engine core initialization failed. See root cause above.
"""


def arg(name: str, default: str) -> str:
    argv = sys.argv
    return argv[argv.index(name) + 1] if name in argv else default


def record_start(state: Path) -> int:
    state.mkdir(parents=True, exist_ok=True)
    starts = state / "starts"
    entry = {"argv": sys.argv[1:], "symm": os.environ.get("VLLM_ALLREDUCE_USE_SYMM_MEM"),
             "pid": os.getpid(), "pgid": os.getpgid(0)}
    with starts.open("a") as fh:
        fh.write(json.dumps(entry) + "\n")
    return len(starts.read_text().splitlines())


class Handler(BaseHTTPRequestHandler):
    model = "standin"

    def _send(self, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send({})
        elif self.path == "/v1/models":
            self._send({"object": "list", "data": [{"id": self.model, "object": "model",
                                                    "max_model_len": 4096}]})
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        req = json.loads(self.rfile.read(length) or b"{}")
        state = Path(os.environ.get("STANDIN_STATE", "/tmp/standin"))
        with (state / "completions").open("a") as fh:
            fh.write(json.dumps({"max_tokens": req.get("max_tokens")}) + "\n")
        time.sleep(float(os.environ.get("STANDIN_COMPLETION_DELAY", "0")))
        n = int(req.get("max_tokens", 1))
        self._send({"id": "cmpl-standin", "object": "text_completion", "model": self.model,
                    "choices": [{"index": 0, "text": "x" * n, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": n,
                              "total_tokens": n + 1}})

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    state = Path(os.environ.get("STANDIN_STATE", "/tmp/standin"))
    start_no = record_start(state)
    print(f"INFO standin engine start #{start_no} argv={sys.argv[1:]}", flush=True)
    fail = os.environ.get("STANDIN_FAIL", "")
    fallback = os.environ.get("VLLM_ALLREDUCE_USE_SYMM_MEM") == "0" and \
        "--compilation-config" in sys.argv
    if fail == "symm-mem" and not fallback:
        time.sleep(0.5)
        print(SYMM_MEM_CRASH, flush=True)
        sys.exit(1)
    if fail == "always":
        print("ValueError: standin cannot load this model", flush=True)
        sys.exit(1)
    gate = os.environ.get("STANDIN_RESTART_GATE")
    if start_no > 1 and gate:
        while not Path(gate).exists():
            time.sleep(0.05)
    Handler.model = arg("--served-model-name", arg("--model", "standin"))
    server = ThreadingHTTPServer((arg("--host", "127.0.0.1"), int(arg("--port", "8001"))),
                                 Handler)
    die_after = os.environ.get("STANDIN_DIE_AFTER")
    if die_after and start_no == 1:
        threading.Timer(float(die_after), lambda: os._exit(3)).start()
    print("INFO Application startup complete.", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
