"""The serving host's CPU work the planner's host profile holds (launcher/planner/hardware.py
``HostProfile``, ``SERVER_HOST``), timed with the installed vLLM's own functions, one thread:

1. a prompt's length on the way to its first token, before any GPU work (``prompt_token_s``);
2. a step's output path per sequence (``seq_step_s``): vLLM's OutputProcessor turning one new
   token of each running sequence into its output (incremental detokenising included) and the
   completion stream chunk's JSON for each, at 1 and 32 sequences; the line through them is a
   fixed part and a part per sequence.

A prompt of N token ids crosses the proxy (toposerve's JSON parse, server/app.py
``parse_object``), vLLM's API server (the completion request parsed and validated), the IPC to
the engine core (msgpack) and the prefix cache's block hashing (sha256 over every full block,
chained): each is proportional to N, and is paid whether or not the prefix is cached. This times
those four steps with the installed vLLM's own functions, one thread, median of 7:

    .venv/bin/python benchmarks/host_prompt_cost.py

Not timed: HTTP framing, the scheduler's block-table bookkeeping, the proxy's and the
client's handling of each stream event. The output path's tokenizer is the embedded tiny
model's (`launcher.model.tinymodel`, a byte-level BPE like Llama 3's).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable

import msgspec
from vllm.entrypoints.openai.completion.protocol import (
    CompletionRequest,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.tokenizers import get_tokenizer
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest
from vllm.v1.engine.output_processor import OutputProcessor

from launcher.model.tinymodel import ensure_tiny_model
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


def output_step_s(sequences: int, steps: int = 64) -> float:
    """Median seconds of one step's output path for ``sequences`` running requests: each gets
    one new token through vLLM's OutputProcessor (detokenised incrementally, as a streamed
    completion's delta) and its stream chunk serialised as the completions endpoint does."""
    tok = get_tokenizer(str(ensure_tiny_model()))
    vocab = min(4000, len(tok))
    out = OutputProcessor(tok, log_stats=False)
    for i in range(sequences):
        params = SamplingParams(max_tokens=10**6, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)
        prompt = [random.randrange(5, vocab) for _ in range(512)]
        out.add_request(EngineCoreRequest(f"r{i}", prompt, None, params, None, 0.0, None, None,
                                          None, external_req_id=f"r{i}"), None)
    times = []
    for _ in range(steps):
        new = [EngineCoreOutput(f"r{i}", [random.randrange(5, vocab)]) for i in range(sequences)]
        t = time.perf_counter()
        for ro in out.process_outputs(new).request_outputs:
            text = ro.outputs[0].text if isinstance(ro.outputs, list) else ""
            choice = CompletionResponseStreamChoice(index=0, text=text)
            CompletionStreamResponse(id=ro.request_id, created=0, model="m",
                                     choices=[choice]).model_dump_json(exclude_unset=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    for n in (8000, 32000):
        parts = parts_s(n)
        total = sum(parts.values())
        cells = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in parts.items())
        print(f"{n:,} tokens: {cells}; {total * 1e3:.2f} ms = {total / n * 1e6:.3f} us/token")
    one, many = output_step_s(1), output_step_s(32)
    per_seq = (many - one) / 31
    print(f"output path per step: {one * 1e6:.0f} us at 1 sequence, {many * 1e6:.0f} us at 32 "
          f"= {one - per_seq:.1e} s fixed + {per_seq * 1e6:.1f} us per sequence")


if __name__ == "__main__":
    main()
