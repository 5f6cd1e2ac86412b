"""Load several models in ONE vLLM CPU process, one after another, and report what vLLM holds.

    python tests/launcher/oracle_probe.py RESULT.json SPEC.json

SPEC.json: a list of {"name", "path", "max_model_len", "kv_bytes", "batched_tokens",
"max_num_seqs"}. For each model: vLLM's offline engine (in-process: no engine-core process to
start) with an explicit KV-cache size; the bytes of the model's parameters and buffers as
vLLM loaded them (before the CPU backend repacks its linear layers); the KV cache's token
capacity as vLLM computed it (the number it logs as "CPU KV cache size: N tokens"), which
vLLM computes only once its start-up check has accepted ``max_model_len``. No generation: in
this in-process mode vLLM 0.32's CPU engine died of an illegal instruction in its first step
on this project's machine (the API-server stack tests generate, with the engine in its own
process). A model vLLM cannot load gets its exception's type and first line instead. Results
are written after each model, so a crash later keeps what was learnt.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # no engine-core process to start
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")


def held_bytes(model: Any) -> int:
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


LOADED: list[int] = []


def record_loaded_weights() -> None:
    """Count the model's tensors as vLLM loaded them, before the CPU backend repacks its linear
    layers for oneDNN (which leaves their torch parameters empty): the figure a GPU logs as
    "Model loading took X GiB"."""
    from vllm.model_executor.model_loader import base_loader

    original = base_loader.process_weights_after_loading

    def wrapped(model: Any, *args: Any, **kwargs: Any) -> Any:
        LOADED.append(held_bytes(model))
        return original(model, *args, **kwargs)

    base_loader.process_weights_after_loading = wrapped


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM

    llm = LLM(
        model=spec["path"],
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=spec["max_model_len"],
        kv_cache_memory_bytes=spec["kv_bytes"],
        max_num_batched_tokens=spec["batched_tokens"],
        max_num_seqs=spec["max_num_seqs"],
        enforce_eager=True,
        enable_prefix_caching=False,
        seed=0,
    )
    try:
        cache = llm.llm_engine.vllm_config.cache_config
        tokens = getattr(cache, "kv_cache_size_tokens", None)
        blocks = getattr(cache, "num_gpu_blocks", None) or getattr(cache, "num_cpu_blocks", None)
        return {
            "weights_bytes": LOADED[-1],
            "kv_tokens": tokens,
            "num_blocks": blocks,
            "block_size": cache.block_size,
        }
    finally:
        engine = getattr(llm.llm_engine, "engine_core", None)
        shutdown = getattr(engine, "shutdown", None)
        if callable(shutdown):
            shutdown()
        del llm
        gc.collect()


def main() -> int:
    result_path, spec_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        specs = json.load(f)
    results: dict[str, Any] = {}
    try:
        import vllm

        version = vllm.__version__
    except Exception as exc:  # reported, not raised: the test says what is missing
        version = f"unimportable: {exc}"
    record_loaded_weights()
    for spec in specs:
        print(f"=== oracle: {spec['name']}", flush=True)
        try:
            results[spec["name"]] = probe(spec)
        except Exception as exc:
            lines = [ln for ln in str(exc).splitlines() if ln.strip()]
            results[spec["name"]] = {
                "error": f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400],
                "trace": traceback.format_exc()[-2000:],
            }
        results["_vllm_version"] = version
        with open(result_path, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
