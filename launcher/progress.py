"""What a starting vLLM is doing, read from its log: one short phase name for the progress line."""

from __future__ import annotations

import re

# Ordered by when they happen during a start; the last one seen in the log wins.
PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("starting engine", re.compile(r"(vLLM API server version|Initializing a V1 LLM engine)")),
    ("loading weights", re.compile(r"(Loading weights|Loading model|load_model|Starting to load)")),
    ("compiling (torch.compile)", re.compile(r"(torch\.compile|Compiling a graph|Dynamo)")),
    ("allocating KV cache", re.compile(r"(KV cache|num_gpu_blocks|GPU KV cache size)")),
    ("capturing graphs", re.compile(r"(Capturing CUDA graph|cudagraph|CUDA graphs)")),
    ("warming up", re.compile(r"(warm(ing)? ?up|Warmup)", re.IGNORECASE)),
    ("starting API server", re.compile(r"(Starting vLLM API server|Application startup complete)")),
)


def current_phase(log_text: str) -> str:
    """The latest start-up phase that the log shows, by position of its last mention."""
    best = ("starting", -1)
    for name, pattern in PHASES:
        for match in pattern.finditer(log_text):
            if match.start() > best[1]:
                best = (name, match.start())
    return best[0]
