"""The one place the host timing meets vLLM's internals (:class:`hostcost.FrontEnd`).

Run as a worker, ``python -m launcher.probe.vllmfront TOKENIZER_DIR KEY_JSON``: it imports the
installed vLLM, times its functions (:func:`hostcost.time_host`) and prints the record's JSON on
its last line; anything vLLM no longer has or calls otherwise (a module moved, a class renamed,
a constructor's arguments changed) ends it with one line on stderr and exit status 3, which the
caller turns into the plan's reason for keeping the shipped profile. A worker process keeps
vLLM's import (seconds, and its platform detection) out of the launcher's own.

The functions, as vLLM 0.26-0.32 name them (benchmarks/host_prompt_cost.py timed the same):
the proxy's ``json.loads`` of the body (its large-body parse), ``CompletionRequest.
model_validate`` (the API server's parse and validation of it), msgpack (the engine core's
IPC), ``hash_block_tokens`` with sha256 (the prefix cache's default),
``OutputProcessor.process_outputs`` with incremental detokenising and
``CompletionStreamResponse.model_dump_json`` (one stream chunk a sequence).
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from typing import Any

from launcher.probe import hostcost


class VllmFrontEnd:
    """The installed vLLM's functions behind :class:`hostcost.FrontEnd`. Construction imports
    them: ImportError or AttributeError when this vLLM has no such functions."""

    def __init__(self, tokenizer_dir: str) -> None:
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

        self._request = CompletionRequest
        self._choice, self._chunk = CompletionResponseStreamChoice, CompletionStreamResponse
        self._kind, self._params = RequestOutputKind, SamplingParams
        self._core_out, self._core_req, self._processor = (
            EngineCoreOutput, EngineCoreRequest, OutputProcessor)
        self._sha = get_hash_fn_by_name("sha256")  # vLLM's default prefix_caching_hash_algo
        init_none_hash(self._sha)
        self._hash = hash_block_tokens
        self._enc, self._dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
        self._tok = get_tokenizer(tokenizer_dir)
        self._rng = random.Random(0)

    def parse_body(self, body: bytes) -> object:
        json.loads(body)  # the proxy's parse of a large body (server/app.py parse_object)
        return self._request.model_validate(json.loads(body))

    def ipc(self, ids: list[int]) -> object:
        return self._dec.decode(self._enc.encode(ids))

    def hash_blocks(self, ids: list[int]) -> object:
        parent = None
        for i in range(0, len(ids) - 15, 16):
            parent = self._hash(self._sha, parent, ids[i:i + 16], None)
        return parent

    def output_step(self, sequences: int) -> Callable[[], object]:
        vocab = min(4000, len(self._tok))
        out = self._processor(self._tok, log_stats=False)
        rng = self._rng
        for i in range(sequences):
            params = self._params(max_tokens=10**6, ignore_eos=True,
                                  output_kind=self._kind.DELTA)
            prompt = [rng.randrange(5, vocab) for _ in range(512)]
            out.add_request(self._core_req(f"r{i}", prompt, None, params, None, 0.0, None, None,
                                           None, external_req_id=f"r{i}"), None)

        def step() -> object:
            new = [self._core_out(f"r{i}", [rng.randrange(5, vocab)]) for i in range(sequences)]
            for ro in out.process_outputs(new).request_outputs:
                text = ro.outputs[0].text if isinstance(ro.outputs, list) else ""
                choice = self._choice(index=0, text=text)
                self._chunk(id=ro.request_id, created=0, model="m",
                            choices=[choice]).model_dump_json(exclude_unset=True)
            return None

        step()  # a first call raises here, not inside the timing, where a signature changed
        return step


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m launcher.probe.vllmfront TOKENIZER_DIR KEY_JSON", file=sys.stderr)
        return 2
    raw: Any = json.loads(argv[1])
    key = hostcost.HostKey(str(raw["cpu"]), int(raw["cores"]), str(raw["vllm"]))
    try:
        fe = VllmFrontEnd(argv[0])
        rec = hostcost.time_host(fe, key, sustain_samples=hostcost.SUSTAIN_SAMPLES)
    # vLLM's internals are not an API: whatever this release lacks or calls otherwise is the
    # reason the shipped profile stays, in one line, never a traceback
    except Exception as exc:
        print(f"the installed vLLM's front-end functions could not be timed: "
              f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
              file=sys.stderr)
        return 3
    print(json.dumps(hostcost.to_json(rec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
