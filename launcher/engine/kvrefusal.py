"""vLLM's refusal to start a context its KV cache cannot hold, read from its log. Pure.

vLLM sizes the KV cache at start-up and refuses a ``--max-model-len`` it cannot hold for one
request. The V1 engine (vllm/v1/core/kv_cache_utils.py ``_check_enough_kv_cache_memory``,
0.8 through 0.32 at least) says::

    To serve at least one request with the model's max seq len (131072), (17.98 GiB KV cache is
    needed, which is larger than the available KV cache memory (16.48 GiB). Based on the
    available memory, the estimated maximum model length is 111456. Try increasing ...

(older releases spell it "models's"; without the estimate when it would be 0). The V0 engine
said "The model's max seq len (X) is larger than the maximum number of tokens that can be
stored in KV cache (Y)". :func:`refusal` finds either and the length vLLM names, so that
``launcher serve`` can start once more with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_V1 = re.compile(
    r"To serve at least one request with the models?'s? max seq len \((?P<asked>\d+)\), "
    r"\((?P<need>\d+(?:\.\d+)?) GiB KV cache is needed, which is larger than the available KV "
    r"cache memory \((?P<have>-?\d+(?:\.\d+)?) GiB\)\.(?: Based on the available memory, the "
    r"estimated maximum model length is (?P<est>\d+)\.)?"
)
_V0 = re.compile(
    r"The model's max seq len \((?P<asked>\d+)\) is larger than the maximum number of tokens "
    r"that can be stored in KV cache \((?P<est>\d+)\)"
)
MIN_RETRY = 256  # below this a restart would not serve a coding agent; say so instead


@dataclass(frozen=True)
class Refusal:
    asked: int  # the --max-model-len vLLM refused
    fits: int  # the longest vLLM says it can hold (0: none)
    need_gib: float | None = None
    have_gib: float | None = None

    @property
    def retry_len(self) -> int | None:
        """The length to start again with, or None when that would be useless."""
        if self.fits < MIN_RETRY or self.fits >= self.asked:
            return None
        return self.fits

    def failure(self) -> str:
        """The one line for a refusal that a restart will not cure."""
        mem = (
            f" ({self.need_gib:g} GiB of KV cache needed, {self.have_gib:g} GiB available)"
            if self.need_gib is not None and self.have_gib is not None
            else ""
        )
        hint = (
            f"pass --max-model-len {self.fits} or less, "
            if self.fits
            else "lower --max-model-len, "
        )
        return (
            f"vLLM cannot hold a {self.asked}-token context{mem}; {hint}"
            "raise --gpu-memory-utilization or use more GPUs"
        )

    def explain(self) -> str:
        mem = (
            f" ({self.need_gib:g} GiB of KV cache needed, {self.have_gib:g} GiB available)"
            if self.need_gib is not None and self.have_gib is not None
            else ""
        )
        if self.retry_len is None:
            return (
                f"vLLM cannot hold a {self.asked}-token context{mem}; lower --max-model-len, "
                "raise --gpu-memory-utilization or use more GPUs"
            )
        return (
            f"vLLM cannot hold the {self.asked}-token context asked of it{mem}; "
            f"starting again with --max-model-len {self.fits}, the longest it says it can hold"
        )


def refusal(log_text: str) -> Refusal | None:
    """The last KV-capacity refusal in ``log_text``, or None when vLLM did not refuse one."""
    found: Refusal | None = None
    for m in _V1.finditer(log_text):
        found = Refusal(int(m["asked"]), int(m["est"] or 0), float(m["need"]), float(m["have"]))
    if found is None:
        for m in _V0.finditer(log_text):
            found = Refusal(int(m["asked"]), int(m["est"]))
    return found
