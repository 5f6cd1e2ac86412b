"""The engine's own cost of a decode step, timed on this machine with the real vLLM engine.

Below a few hundred million parameters a decode step is not arithmetic: it is the engine's host
work (scheduling, preparing inputs, launching a layer's operations, sampling, handing the token
to the front end). That cost follows the machine (its cores, its clock, what else runs), so a
constant fitted on one machine was off by a factor of 2.6 on the same machine a day later. So
`launcher probe --measure` starts vLLM itself (offline, in a process of its own, on the embedded
tiny model, with the serve path's engine settings), times decode steps as the difference between
a long and a short generation of the same cached prompt, and keeps the median step; the planner
then takes the engine's step overhead from it: the measured step less what the roofline gives
the tiny model's own forward pass.

Pure parts (the record, its JSON and cache key) need nothing; vLLM is imported only by the
worker, which :func:`measure` runs as ``python -m launcher.cli.measure_worker engine-step``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from launcher.probe.kernels import write_cache_json

FORMAT = 1
WORKER_TIMEOUT_S = 600
# Decode steps per timed generation and timed pairs: enough that the per-request costs the
# difference cancels are small beside them, few enough to finish in seconds on a CPU.
STEPS = 64
ROUNDS = 5
PROMPT_TOKENS = 256


class EngineStepError(ValueError):
    """A step measurement that failed or a saved one that cannot be read (one line)."""


@dataclass(frozen=True)
class StepKey:
    device: str  # "cpu: AMD EPYC 7B13 (2 threads)", "NVIDIA H200"
    vllm: str
    torch: str

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class EngineStep:
    key: StepKey
    step_s: float  # median decode step of the measured model, one stream
    steps_s: tuple[float, ...]  # every round's step, for the spread
    # the measured model's size, so the planner can take its own forward pass out of the step
    model_params: int
    model_weight_bytes: int
    measured_at: str

    @property
    def spread(self) -> float:
        """Slowest round over fastest: how steady the machine was while it was measured."""
        return max(self.steps_s) / min(self.steps_s) if self.steps_s else 1.0


# ------------------------------------------------------------------------------------- JSON
def to_json(rec: EngineStep) -> dict[str, Any]:
    return {"version": FORMAT, **asdict(rec)}


def _num(raw: Any, what: str, hi: float) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise EngineStepError(f"{what} is not a number: {str(raw)[:40]!r}")
    value = float(raw)
    if not math.isfinite(value) or not 0 < value < hi:
        raise EngineStepError(f"{what} is out of range: {value!r}")
    return value


def _text(raw: Any, what: str) -> str:
    if not isinstance(raw, str):
        raise EngineStepError(f"{what} is not text")
    return raw[:200]


def from_json(raw: Any) -> EngineStep:
    """A saved measurement; :class:`EngineStepError` (one line) for anything unreadable."""
    if not isinstance(raw, dict):
        raise EngineStepError("an engine step record is not a JSON object")
    if raw.get("version") != FORMAT:
        raise EngineStepError(f"engine step record version {str(raw.get('version'))[:20]!r} "
                              f"is not {FORMAT}")
    k = raw.get("key")
    if not isinstance(k, dict):
        raise EngineStepError("the engine step record has no key object")
    key = StepKey(*(_text(k.get(f), f) for f in ("device", "vllm", "torch")))
    steps = raw.get("steps_s")
    if not isinstance(steps, list) or not steps or len(steps) > 1000:
        raise EngineStepError("steps_s is not a non-empty list")
    return EngineStep(
        key,
        _num(raw.get("step_s"), "step_s", 60.0),
        tuple(_num(s, "a round's step", 60.0) for s in steps),
        int(_num(raw.get("model_params"), "model_params", 1e13)),
        int(_num(raw.get("model_weight_bytes"), "model_weight_bytes", 1e14)),
        _text(raw.get("measured_at"), "measured_at"),
    )


def cache_path(cache_dir: Path, key: StepKey) -> Path:
    return cache_dir / "engine-step" / f"{key.digest()}.json"


def save(cache_dir: Path, rec: EngineStep) -> Path | None:
    """Keep the measurement where a later plan finds it; None when the cache is not writable."""
    return write_cache_json(cache_path(cache_dir, rec.key), to_json(rec))


def load(cache_dir: Path, key: StepKey) -> EngineStep | None:
    """The kept measurement for ``key``; None when there is none or it cannot be read."""
    try:
        rec = from_json(json.loads(cache_path(cache_dir, key).read_text()))
    except (OSError, ValueError, RecursionError):
        return None
    return rec if rec.key == key else None


# ---------------------------------------------------------------------------------- timing
def step_from_rounds(short_s: list[float], long_s: list[float], steps: int) -> list[float]:
    """Per-step time of each round: the long generation less the short one, over the steps
    between them (prompt, scheduling of the request and the first token cancel out)."""
    return [max(1e-6, (lo - sh) / steps) for sh, lo in zip(short_s, long_s, strict=True)]


def worker(model: Path, out: Path, *, max_model_len: int, kv_cache_gib: float,
           steps: int = STEPS, rounds: int = ROUNDS) -> None:
    """Run in a process of its own: start vLLM's offline engine on ``model`` and time it."""
    import random

    from vllm import LLM, SamplingParams  # the engine itself, only in this worker
    from vllm.inputs import TokensPrompt

    kw: dict[str, Any] = {"model": str(model), "max_model_len": max_model_len,
                          "enable_prefix_caching": True, "seed": 0}
    if os.environ.get("VLLM_TARGET_DEVICE") == "cpu" or not _has_cuda():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{kv_cache_gib:g}")
    else:
        kw["gpu_memory_utilization"] = 0.1
    llm = LLM(**kw)
    cfg = llm.llm_engine.model_config.hf_config
    vocab = int(getattr(cfg, "vocab_size", 1000))
    rng = random.Random(0)
    prompt = TokensPrompt(prompt_token_ids=[rng.randrange(5, vocab) for _ in
                                            range(min(PROMPT_TOKENS, max_model_len // 2))])

    def gen(n: int) -> float:
        sp = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True)
        t = time.perf_counter()
        llm.generate([prompt], sp, use_tqdm=False)
        return time.perf_counter() - t

    gen(2), gen(steps + 2)  # warm-up: the first steps of a fresh engine are slower
    short, long_ = [], []
    for _ in range(rounds):
        short.append(gen(2))
        long_.append(gen(steps + 2))
    out.write_text(json.dumps({"steps_s": step_from_rounds(short, long_, steps)}))


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def measure(key: StepKey, model: Path, cache_dir: Path, env: Mapping[str, str], *,
            params: int, weight_bytes: int, max_model_len: int, kv_cache_gib: float,
            now: str | None = None) -> tuple[EngineStep, Path | None]:
    """Time the engine's decode step in a worker process and keep it."""
    workdir = cache_dir / "engine-step"
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EngineStepError(f"cannot write under {workdir}: {exc.strerror}") from exc
    out = workdir / f"{key.digest()}.new.json"
    cmd = [sys.executable, "-m", "launcher.cli.measure_worker", "engine-step", "--model",
           str(model), "--out", str(out), "--max-model-len", str(max_model_len),
           "--kv-cache-gib", f"{kv_cache_gib:g}"]
    # A session of its own: the engine's own processes go with the worker on a timeout.
    proc = subprocess.Popen(cmd, env=dict(env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise EngineStepError(
            f"the engine step measurement took over {WORKER_TIMEOUT_S} s") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything the engine left behind
    try:
        raw = json.loads(out.read_text())
        steps = tuple(_num(s, "a round's step", 60.0) for s in raw["steps_s"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        tail = " | ".join(err.decode(errors="replace").strip().splitlines()[-3:])
        raise EngineStepError(
            f"the engine step measurement failed (exit {proc.returncode}): {tail[:300]}"
        ) from exc
    finally:
        out.unlink(missing_ok=True)
    rec = EngineStep(key, statistics.median(steps), steps, params, weight_bytes,
                     now or time.strftime("%Y-%m-%dT%H:%M:%S"))
    return rec, save(cache_dir, rec)
