"""A stand-in OpenAI-compatible server that is not vLLM: no /tokenize, real token counts.

    python -m tests.loadgen.standin --tokenizer DIR [--port 0] [--ttft 0.05] [--itl 0.01]
        [--tokens-per-chunk K] [--no-usage] [--cached-tokens] [--ids] [--gpu-metrics F ...]
        [--eos-after N] [--strict-fields] [--tokenize] [--extra-prompt-tokens K]

What llama.cpp's server, SGLang, TGI or a hosted API look like to loadgen: /v1/models,
/v1/completions and /v1/chat/completions (streamed or not), /metrics, and nothing else (every
other path is a 404, /tokenize included). Prompts are counted with a real Hugging Face tokenizer
(text with special tokens, chat through the tokenizer's chat template), so `usage.prompt_tokens`
is what a real server would report. Token-id prompts are refused unless `--ids`.

Output: max_tokens tokens of one single-token word, token i due at t0 + ttft + i·itl, sent in
events of K tokens (at the due time of each event's last token). A prefix cache is simulated
(longest common prefix with an earlier prompt, in blocks of 16 tokens), reported as
usage.prompt_tokens_details.cached_tokens with `--cached-tokens`, and always as
vllm:prefix_cache_queries/hits counters on /metrics. `--gpu-metrics FILE ...` appends recorded
toposerve GPU metrics to /metrics, one file per scrape in turn (the last one repeats).
`--tokenize` adds a vLLM-style POST /tokenize (text or chat messages through the tokenizer;
a tokenizer without a chat template answers 400 with transformers' own message, as vLLM does).
`--extra-prompt-tokens K` reports K more prompt tokens in usage than the tokenizer counts, as a
server that adds a BOS token or a system prompt of its own does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.tokens import _generic_class
from simengine.engine import stop_process

READY = "standin listening on "
BLOCK = 16


@dataclass
class Options:
    tokenizer: str
    host: str = "127.0.0.1"
    port: int = 0
    ttft: float = 0.05
    itl: float = 0.01
    tokens_per_chunk: int = 1
    usage: bool = True
    cached_tokens: bool = False
    ids: bool = False
    model: str = "standin-model"
    max_model_len: int = 4096
    gpu_metrics: list[Path] = field(default_factory=list)
    eos_after: int | None = None  # without ignore_eos, stop after this many tokens
    strict_fields: bool = False  # refuse vLLM's min_tokens/ignore_eos, as OpenAI's API does
    tokenize: bool = False  # a vLLM-style /tokenize
    extra_prompt_tokens: int = 0  # added to usage.prompt_tokens


def _load_tokenizer(name: str) -> Any:
    """The class AutoTokenizer picks; a generic one without AutoTokenizer's torch import (over
    5 s of each stand-in start), as loadgen loads it: test_tokenizer_fast_path.py shows both
    ways count alike."""
    if _generic_class(Path(name)):
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(name)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


class Engine:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.tok = _load_tokenizer(opts.tokenizer)
        self.word = self._single_token_word()
        self.history: deque[list[int]] = deque(maxlen=256)
        self.queries = 0
        self.hits = 0
        self.scrapes = 0
        self.requests = 0
        # What the engine saw, for benchmarks to compare with what each client reports.
        self.log: list[dict[str, Any]] = []
        self.running = 0
        self.late_sum = 0.0
        self.late_max = 0.0
        self.tokens = 0

    def _single_token_word(self) -> str:
        for word in (" the", " a", " x", " tok", " e"):
            if len(self.tok(word * 8, add_special_tokens=False)["input_ids"]) == 8:
                return word
        raise SystemExit("no single-token word found in this tokenizer")

    def prompt_ids(self, body: dict[str, Any], chat: bool) -> list[int]:
        if chat:
            out = self.tok.apply_chat_template(
                body["messages"], add_generation_prompt=True, tokenize=True
            )
            return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return list(self.tok(prompt)["input_ids"])
        if self.opts.ids and isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise ValueError("prompt must be a string (this server takes no token ids)")

    def cached(self, ids: list[int]) -> int:
        best = 0
        for old in self.history:
            n = 0
            for a, b in zip(old, ids, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self.history.append(ids)
        hit = min(best, len(ids) - 1) // BLOCK * BLOCK
        self.queries += len(ids)
        self.hits += hit
        return hit

    def metrics(self) -> str:
        lines = [
            "# TYPE vllm:prefix_cache_queries counter",
            f'vllm:prefix_cache_queries_total{{model_name="{self.opts.model}"}} {self.queries}.0',
            "# TYPE vllm:prefix_cache_hits counter",
            f'vllm:prefix_cache_hits_total{{model_name="{self.opts.model}"}} {self.hits}.0',
        ]
        text = "\n".join(lines) + "\n"
        files = self.opts.gpu_metrics
        if files:
            text += files[min(self.scrapes, len(files) - 1)].read_text()
            self.scrapes += 1
        return text


async def handle(
    engine: Engine, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
            body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
            await route(engine, writer, method, path.split("?", 1)[0], body)
            if headers.get("connection", "").lower() == "close":
                break
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


def _send(writer: asyncio.StreamWriter, status: int, body: bytes, kind: str) -> None:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: {kind}\r\n"
        f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _error(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = {"error": {"message": message, "type": "BadRequestError", "code": status}}
    _send(writer, status, json.dumps(body).encode(), "application/json")


async def route(
    engine: Engine, writer: asyncio.StreamWriter, method: str, path: str, raw: bytes
) -> None:
    opts = engine.opts
    if (method, path) == ("GET", "/v1/models"):
        card = {"id": opts.model, "object": "model", "max_model_len": opts.max_model_len}
        _send(
            writer, 200, json.dumps({"object": "list", "data": [card]}).encode(), "application/json"
        )
    elif (method, path) == ("GET", "/sim/stats"):
        stats = {
            "running": engine.running,
            "requests": engine.log,
            "tokens": engine.tokens,
            "late_sum_s": engine.late_sum,
            "late_max_s": engine.late_max,
        }
        _send(writer, 200, json.dumps(stats).encode(), "application/json")
    elif (method, path) == ("POST", "/sim/reset"):
        engine.log, engine.tokens, engine.late_sum, engine.late_max = [], 0, 0.0, 0.0
        _send(writer, 200, b"{}", "application/json")
    elif (method, path) == ("GET", "/metrics"):
        _send(writer, 200, engine.metrics().encode(), "text/plain; version=0.0.4")
    elif (method, path) == ("POST", "/tokenize") and opts.tokenize:
        tokenize(engine, writer, json.loads(raw))
    elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
        await generate(engine, writer, json.loads(raw), path.endswith("chat/completions"))
    else:
        _error(writer, 404, f"no route {method} {path}")
    await writer.drain()


def tokenize(engine: Engine, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    """vLLM's /tokenize: {"count", "max_model_len", "tokens"}; a refusal is a 400 whose message
    is the tokenizer's own (vLLM passes transformers' exception text on)."""
    try:
        if "messages" in body:
            ids = engine.prompt_ids(body, chat=True)
        else:
            special = bool(body.get("add_special_tokens", True))
            ids = list(engine.tok(str(body["prompt"]), add_special_tokens=special)["input_ids"])
    except (ValueError, KeyError, TypeError) as exc:
        _error(writer, 400, str(exc))
        return
    answer = {"count": len(ids), "max_model_len": engine.opts.max_model_len, "tokens": ids}
    _send(writer, 200, json.dumps(answer).encode(), "application/json")


async def generate(
    engine: Engine, writer: asyncio.StreamWriter, body: dict[str, Any], chat: bool
) -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    opts = engine.opts
    refused = [k for k in ("min_tokens", "ignore_eos") if k in body] if opts.strict_fields else []
    if refused:
        _error(writer, 400, f"Unrecognized request argument supplied: {refused[0]}")
        return
    try:
        ids = engine.prompt_ids(body, chat)
    except (ValueError, KeyError, TypeError) as exc:
        _error(writer, 400, str(exc))
        return
    asked = body.get("max_tokens") or body.get("max_completion_tokens") or 16
    n = int(asked)
    if opts.eos_after is not None and not body.get("ignore_eos"):
        n = min(n, max(opts.eos_after, int(body.get("min_tokens") or 0)))
    if len(ids) + n > opts.max_model_len:
        _error(writer, 400, f"maximum context length is {opts.max_model_len} tokens")
        return
    engine.requests += 1
    engine.log.append(
        {
            "prompt_tokens": len(ids),
            "max_tokens": asked,
            "completion_tokens": n,
            "stream": bool(body.get("stream")),
            "chat": chat,
        }
    )
    cached = engine.cached(ids)
    reported = len(ids) + opts.extra_prompt_tokens
    usage: dict[str, Any] = {
        "prompt_tokens": reported,
        "completion_tokens": n,
        "total_tokens": reported + n,
    }
    if opts.cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    head = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{engine.requests}",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": opts.model,
    }
    engine.running += 1
    try:
        await _answer(engine, writer, body, chat, t0, n, head, usage)
    finally:
        engine.running -= 1
        engine.tokens += n


async def _answer(
    engine: Engine,
    writer: asyncio.StreamWriter,
    body: dict[str, Any],
    chat: bool,
    t0: float,
    n: int,
    head: dict[str, Any],
    usage: dict[str, Any],
) -> None:
    loop = asyncio.get_running_loop()
    opts = engine.opts
    if not body.get("stream"):
        await asyncio.sleep(max(0.0, t0 + opts.ttft + (n - 1) * opts.itl - loop.time()))
        text = engine.word * n
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}}
            if chat
            else {"index": 0, "text": text}
        )
        answer = {
            **head,
            "choices": [{**choice, "finish_reason": "length"}],
            **({"usage": usage} if opts.usage else {}),
        }
        _send(writer, 200, json.dumps(answer).encode(), "application/json")
        return
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    k = opts.tokens_per_chunk
    for start in range(0, n, k):
        size = min(k, n - start)
        due = t0 + opts.ttft + (start + size - 1) * opts.itl
        await asyncio.sleep(max(0.0, due - loop.time()))
        late = loop.time() - due
        engine.late_sum += late * size
        engine.late_max = max(engine.late_max, late)
        text = engine.word * size
        finish = "length" if start + size >= n else None
        delta: dict[str, Any] = (
            {
                "index": 0,
                "delta": {"role": "assistant", "content": text} if not start else {"content": text},
            }
            if chat
            else {"index": 0, "text": text}
        )
        _chunk(writer, {**head, "choices": [{**delta, "logprobs": None, "finish_reason": finish}]})
    options = body.get("stream_options") or {}
    if opts.usage and options.get("include_usage"):
        _chunk(writer, {**head, "choices": [], "usage": usage})
    _chunk_bytes(writer, b"data: [DONE]\n\n")
    writer.write(b"0\r\n\r\n")


def _chunk(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
    _chunk_bytes(writer, b"data: " + json.dumps(obj).encode() + b"\n\n")


def _chunk_bytes(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


async def serve(opts: Options) -> None:
    engine = Engine(opts)
    server = await asyncio.start_server(lambda r, w: handle(engine, r, w), opts.host, opts.port)
    port = server.sockets[0].getsockname()[1]
    print(f"{READY}http://{opts.host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


@contextmanager
def spawn(*args: str, timeout: float = 60.0) -> Iterator[str]:
    """Run the stand-in in its own process; yields its URL; stops it afterwards."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.loadgen.standin", *args],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith(READY):
            raise RuntimeError(f"stand-in did not start (exit {proc.poll()}): {line!r}")
        yield line[len(READY) :].strip()
    finally:
        stop_process(proc, 10)


def parse(argv: list[str]) -> Options:
    p = argparse.ArgumentParser(prog="standin")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft", type=float, default=0.05)
    p.add_argument("--itl", type=float, default=0.01)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--no-usage", action="store_true")
    p.add_argument("--cached-tokens", action="store_true")
    p.add_argument("--ids", action="store_true")
    p.add_argument("--model", default="standin-model")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--gpu-metrics", type=Path, nargs="*", default=[])
    p.add_argument("--eos-after", type=int)
    p.add_argument("--strict-fields", action="store_true")
    p.add_argument("--tokenize", action="store_true")
    p.add_argument("--extra-prompt-tokens", type=int, default=0)
    a = p.parse_args(argv)
    return Options(
        a.tokenizer,
        a.host,
        a.port,
        a.ttft,
        a.itl,
        a.tokens_per_chunk,
        not a.no_usage,
        a.cached_tokens,
        a.ids,
        a.model,
        a.max_model_len,
        list(a.gpu_metrics),
        a.eos_after,
        a.strict_fields,
        a.tokenize,
        a.extra_prompt_tokens,
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(parse(sys.argv[1:])))
