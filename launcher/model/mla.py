"""Multi-head latent attention's (MLA: DeepSeek-V2/V3, Kimi, Moonlight) own sizes, from the
config's fields. Pure, total: a config without them has none.

vLLM runs an MLA layer as (vllm/model_executor/layers/mla.py and
vllm/v1/attention/backends/mla/common.py):

- the projections: ``q_proj`` (hidden -> heads x (nope + rope)), or with a query LoRA
  ``q_a_proj`` (hidden -> q_lora_rank) and ``q_b_proj`` (q_lora_rank -> heads x (nope + rope));
  ``kv_a_proj_with_mqa`` (hidden -> kv_lora_rank + rope), whose output is the cached latent;
  ``o_proj`` (heads x v_head_dim -> hidden);
- a prompt chunk: ``kv_b_proj`` (kv_lora_rank -> heads x (nope + v_head_dim)) decompresses the
  latent into per-head K and V, then FlashAttention runs as multi-head attention with q/k head
  dim nope + rope and v head dim v_head_dim (padded to the q/k dim where the kernel needs one);
- a decode step: the absorbed form, no decompression: q_nope times W_UK (a per-head bmm into
  the latent space), multi-query attention of ``heads`` query heads of kv_lora_rank + rope over
  the one cached latent head of that width, and the output times W_UV (a per-head bmm back to
  v_head_dim). The two bmms read the same weights as kv_b_proj.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MlaDims:
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0  # 0: one q_proj, no query LoRA

    @property
    def latent_dim(self) -> int:
        """The cached latent's width, and a decode query head's (absorbed)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        """A prompt chunk's q/k head dim after decompression."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def _count(raw: Any) -> int:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and 0 < raw < 1 << 20 else 0


def dims(t: Mapping[str, Any]) -> MlaDims | None:
    """The MLA sizes of a (text) config; None where it is not latent attention or a size the
    layer needs is missing (the planner then keeps its per-head approximation)."""
    rank, rope = _count(t.get("kv_lora_rank")), _count(t.get("qk_rope_head_dim"))
    nope, v = _count(t.get("qk_nope_head_dim")), _count(t.get("v_head_dim"))
    if not (rank and rope and nope and v):
        return None
    return MlaDims(rank, rope, nope, v, _count(t.get("q_lora_rank")))
