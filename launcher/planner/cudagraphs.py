"""The served vLLM's CUDA graphs: which steps replay which graphs, in ONE place. Pure.

Every step timer (the roofline's, the kernel table's, the load and agent simulations') asks
:class:`CudaGraphs` how a step of so many tokens runs, instead of each taking a capture range
of its own. What vLLM does (read from vLLM 0.32's source, vllm/config/vllm.py
``VllmConfig._set_cudagraph_sizes`` and vllm/config/compilation.py; the lent H200's vLLM 0.26
logged the same sizes and mode at start-up, benchmarks/gpu/results/2026-12-02-h200-table3/
smollm2-default/logs):

- the V1 default ``cudagraph_mode`` is FULL_AND_PIECEWISE: a step of decoders only (one query
  token each) replays one full graph of the whole forward; a step holding prompt tokens replays
  piecewise graphs, the model split at its attention ops (``splitting_ops``: the KV-cache write
  and the attention), which run eagerly between the pieces;
- the capture sizes, unless the flags list them: [1, 2, 4] + every 8 below 256 + every 16 from
  256 up to ``max_cudagraph_capture_size``, which defaults to min(2 x max_num_seqs, 512; 1024 on
  data-centre Blackwell, compute capability 10.x), and never past ``max_num_batched_tokens``
  (that budget is appended where it is inside the range, and ``max_num_seqs`` with it);
- a step of n tokens is padded up to the smallest captured size >= n and replays that size's
  graph (its GEMMs run the padded rows); past the largest size the step runs eagerly, decoders
  only or not: every kernel launched from Python.

What is not modelled: FULL, FULL_DECODE_ONLY and PIECEWISE modes set by the user (the flags
give the range only, cli/planopts.engine_graph_tokens; FULL_AND_PIECEWISE is assumed), and a
user's own size list, which is taken as vLLM's default list up to its largest size.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from launcher.model.families import LOGGED_RELEASE, Release

StepMode = Literal["full", "piecewise", "eager"]

# vLLM's default ceiling of the capture range (``default_max_graph_size``), by the GPUs' compute
# capability major: 1024 on data-centre Blackwell, 512 elsewhere.
DEFAULT_MAX_SIZE = 512
BLACKWELL_DC_MAX_SIZE = 1024


def default_sizes(largest: int) -> tuple[int, ...]:
    """vLLM's default capture sizes up to ``largest`` tokens (ascending)."""
    if largest <= 0:
        return ()
    sizes = [s for s in (1, 2, 4) if s <= largest]
    sizes += list(range(8, min(largest + 1, 256), 8))
    sizes += list(range(256, largest + 1, 16))
    return tuple(sorted(set(sizes)))


@dataclass(frozen=True)
class CudaGraphs:
    """The graphs one served engine captured: ``sizes`` (tokens a step, ascending; empty: none,
    every step eager, as ``--enforce-eager``) and where the figure came from."""

    sizes: tuple[int, ...] = ()
    source: str = "no CUDA graphs (every step eager)"
    # the served vLLM's release line (None: not known), which decides how much of the KV budget
    # its start-up takes for these graphs (memfit.cudagraph_bytes); no step timer reads it
    vllm: Release | None = LOGGED_RELEASE

    @property
    def max_tokens(self) -> int:
        """The largest captured step; a longer one runs eagerly."""
        return self.sizes[-1] if self.sizes else 0

    def padded(self, tokens: int) -> int:
        """The rows a step of ``tokens`` runs: the smallest captured size >= ``tokens`` within
        the range, ``tokens`` itself past it (eager: no padding)."""
        i = bisect.bisect_left(self.sizes, tokens)
        return self.sizes[i] if i < len(self.sizes) else tokens

    def mode(self, prefill_tokens: int, tokens: int) -> StepMode:
        """How a step of ``tokens`` tokens, ``prefill_tokens`` of them prompt tokens, runs:
        eagerly past the range; within it one full graph for decoders only, piecewise graphs
        (attention eager between the pieces) for a step with prompt tokens."""
        if tokens > self.max_tokens or tokens <= 0:
            return "eager"
        return "full" if prefill_tokens == 0 else "piecewise"


EAGER = CudaGraphs()


@dataclass(frozen=True)
class Requested:
    """What decides the served engine's graphs before its GPUs are known: the range the user's
    own vLLM flags set (``tokens``; None: vLLM's default rule) and the scheduler limits the
    default rule reads."""

    tokens: int | None = None
    max_num_seqs: int = 256
    batched_tokens: int | None = None  # max_num_batched_tokens, where known
    vllm: Release | None = LOGGED_RELEASE  # the served release (Policy.vllm), kept on the graphs

    def on(self, ccs: Iterable[tuple[int, int] | None] = ()) -> CudaGraphs:
        """The graphs vLLM captures on GPUs of these compute capabilities."""
        if self.tokens is not None:
            return CudaGraphs(default_sizes(self.tokens),
                              f"CUDA graphs to {self.tokens} tokens (the engine flags)"
                              if self.tokens else "no CUDA graphs (the engine flags)", self.vllm)
        caps = [c for c in ccs if c is not None]
        ceiling = (BLACKWELL_DC_MAX_SIZE if caps and all(c[0] == 10 for c in caps)
                   else DEFAULT_MAX_SIZE)
        largest = min(2 * self.max_num_seqs, ceiling)
        if self.batched_tokens is not None:
            largest = min(largest, self.batched_tokens)
        extra = [n for n in (self.batched_tokens, self.max_num_seqs)
                 if n is not None and n <= largest]
        sizes = tuple(sorted(set(default_sizes(largest)) | set(extra)))
        return CudaGraphs(sizes, f"CUDA graphs to {largest} tokens (vLLM's default: "
                                 f"min(2 x max_num_seqs {self.max_num_seqs}, {ceiling}))",
                          self.vllm)

    @property
    def max_tokens(self) -> int:
        """The range's top where the GPUs do not change it (all but data-centre Blackwell)."""
        return self.on().max_tokens


VLLM_RULE = Requested()  # no flags, max_num_seqs 256
VLLM_DEFAULT = VLLM_RULE.on()  # ... not on Blackwell: graphs to 512 tokens
