"""What a starting vLLM is doing, read from its log: one short phase name for the progress line.

Each log line is classified by its message alone: the prefix (process, level, time and source
file, such as ``[kernel_warmup.py:227]``) is cut off first, and the lines that dump the whole
configuration (``non-default args: {...}``, ``Initializing a V1 LLM engine ... with config:``)
only mean that the engine is starting, however many phase words they hold. Without both rules
a GPU start showed "capturing graphs" before "loading weights": the configuration dump mentions
``cudagraph`` and a module is called ``kernel_warmup``.
"""

from __future__ import annotations

import re

STARTING = "starting"

# In the order they happen during a start. A line is given the first phase whose pattern it
# matches; the progress line shows the phase of the latest line that has one.
PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("starting engine", re.compile(
        r"non-default args|Initializing a V1 LLM engine|vLLM API server version|world_size=")),
    ("loading weights", re.compile(
        r"Loading model|Loading weights|Starting to load model|Loading safetensors"
        r"|Model loading took")),
    ("compiling (torch.compile)", re.compile(
        r"Dynamo bytecode transform|Compiling a graph|torch\.compile took"
        r"|Cache the graph of compile range|Warming up model for the compilation")),
    ("profiling memory", re.compile(r"profiling/warmup run|Memory profiling")),
    ("allocating KV cache", re.compile(
        r"Available KV cache memory|KV cache size|num_gpu_blocks|Maximum concurrency for")),
    ("warming up", re.compile(r"Kernel warmup|Warming up(?! done)|Autotuning process")),
    ("capturing graphs", re.compile(r"Capturing CUDA graph|Graph capturing|capturing cudagraph",
                                    re.IGNORECASE)),
    ("starting API server", re.compile(
        r"Starting vLLM (API )?server|Available routes|Application startup complete")),
)

# "(EngineCore pid=824) INFO 12-01 08:44:47 [kernel_warmup.py:227] " and its variants:
# the process tag, a level, a date and time, the source file.
_PREFIX = re.compile(
    r"^(?:\(\w+(?: pid=\d+)?\)\s*)?"
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+)?"
    r"(?:\[[^\]\s]+\]\s*)?")


def line_phase(line: str) -> str | None:
    """The start-up phase one log line shows, or None."""
    message = _PREFIX.sub("", line, count=1)
    for name, pattern in PHASES:
        if pattern.search(message):
            return name
    return None


def current_phase(log_text: str) -> str:
    """The phase of the latest log line that shows one ("starting" before any does)."""
    for line in reversed(log_text.splitlines()):
        phase = line_phase(line)
        if phase is not None:
            return phase
    return STARTING
