"""The host's cost of a prompt's length on the way to its first token, before any GPU work:
what the planner assumes as costmodel.PROMPT_TOKEN_HOST_S (docs/planner.md, section 9).

A prompt of N token ids crosses the proxy (toposerve's JSON parse, server/app.py
``parse_object``), vLLM's API server (the completion request parsed and validated), the IPC to
the engine core (msgpack) and the prefix cache's block hashing (sha256 over every full block,
chained): each is proportional to N, and is paid whether or not the prefix is cached. This times
those four steps with the installed vLLM's own functions, one thread, median of 7:

    .venv/bin/python benchmarks/host_prompt_cost.py

Not timed: HTTP framing, the scheduler's block-table bookkeeping, the output path.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable

import msgspec
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash

from server.app import parse_object


def median_s(f: Callable[[], object], n: int = 7) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def parts_s(n: int) -> dict[str, float]:
    """Each step's median seconds for a prompt of ``n`` random token ids."""
    sha = get_hash_fn_by_name("sha256")  # vLLM's default prefix_caching_hash_algo
    init_none_hash(sha)
    ids = [random.randrange(4096) for _ in range(n)]
    body = json.dumps({"model": "m", "prompt": ids, "max_tokens": 128, "stream": True}).encode()

    def hashing() -> None:
        parent = None
        for i in range(0, n - 15, 16):
            parent = hash_block_tokens(sha, parent, ids[i:i + 16], None)

    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
    return {
        "proxy parse": median_s(lambda: parse_object(body, 100_000)),
        "vLLM request parse": median_s(
            lambda: CompletionRequest.model_validate(json.loads(body))),
        "IPC msgpack": median_s(lambda: dec.decode(enc.encode(ids))),
        "block hashing": median_s(hashing),
    }


def main() -> None:
    for n in (8000, 32000):
        parts = parts_s(n)
        total = sum(parts.values())
        cells = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in parts.items())
        print(f"{n:,} tokens: {cells}; {total * 1e3:.2f} ms = {total / n * 1e6:.3f} us/token")


if __name__ == "__main__":
    main()
