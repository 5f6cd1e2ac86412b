"""A random-weight checkpoint of a shape folder, laid out as a Hugging Face checkpoint of that
architecture, so that vLLM loads it with ``--load-format auto`` as it loads a real one.

Why: vLLM's dummy loader (``--load-format dummy``) leaves a quantized layer's INTEGER parameters
(AWQ ``qweight``, ``qzeros``) as ``torch.empty`` (zeros on a fresh card: weight_utils.py's
initialize_single_dummy_weight returns early on non-float tensors), and the H200's 4-bit GEMM
runs x0.82-0.83 of the random-weight time at 8192 tokens, x0.85-0.91 at 512 on those zeros
(results/2026-12-04-h200-table9/dummy-weights.txt). A 4-bit engine served this way is faster
than a real checkpoint's, which is what the plans describe.

    python3 benchmarks/gpu/random_checkpoint.py SHAPE_DIR OUT_DIR [--seed N] [--device cuda]
    python3 benchmarks/gpu/random_checkpoint.py SHAPE_DIR --list    (names, shapes, bytes only)

OUT_DIR: the shape folder's config and tokenizer files, and model.safetensors (or, above
--shard-gib, model-0000k-of-0000n.safetensors with model.safetensors.index.json). Tensor names
and shapes are those of the architecture's Hugging Face checkpoint, derived from config.json for
Llama / Qwen2 / Qwen3 decoders (the names vLLM's llama.py / qwen2.py / qwen3.py load through their
WeightsMapper: q/k/v_proj, o_proj, gate/up/down_proj, q_norm/k_norm, biases as the modules have
them). With an AWQ quantization_config (4 bits, GEMM version) each linear not in
modules_to_not_convert is AutoAWQ's GEMM layout, the one vLLM's auto_awq.py create_weights
registers: ``qweight`` int32 [in, out/8], ``qzeros`` int32 [in/group, out/8] (both random over
the whole int32 range), ``scales`` [in/group, out] uniform in 0.001-0.01. Embeddings, norms and
lm_head are floating point (the config's dtype; float16 for AWQ without one).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# architectures whose Hugging Face tensor names are derived below, each checked against vLLM's
# model class (vllm/model_executor/models/<file>.py) for the modules and biases it builds
KNOWN = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
FLOAT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
PACK = 8  # 4-bit values in one int32
INDEX = "model.safetensors.index.json"


class CheckpointError(Exception):
    """A config this script cannot lay out (the message is one line)."""


@dataclass(frozen=True)
class Tensor:
    """One tensor of the checkpoint: its dtype name, shape, and how its values are drawn."""

    dtype: str
    shape: tuple[int, ...]
    kind: str  # qweight/qzeros (random int32), scales, norm, bias, weight

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * (4 if self.dtype == "int32" else FLOAT_BYTES[self.dtype])


@dataclass(frozen=True)
class Awq:
    group_size: int
    skip: tuple[str, ...]


def _awq(cfg: dict[str, Any]) -> Awq | None:
    qc = cfg.get("quantization_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method != "awq":
        raise CheckpointError(f"quantization {method or '?'} is not one this script writes "
                              "(AWQ 4-bit GEMM only)")
    bits = qc.get("bits", qc.get("w_bit"))
    version = str(qc.get("version", "gemm")).lower()
    if bits != 4 or version != "gemm":
        raise CheckpointError(f"AWQ bits {bits} version {version}: only 4-bit GEMM is written")
    if qc.get("lm_head"):
        raise CheckpointError("AWQ with a quantized lm_head is not one this script writes")
    group = int(qc.get("group_size", qc.get("q_group_size", 128)))
    return Awq(group, tuple(qc.get("modules_to_not_convert") or ()))


def _int(cfg: dict[str, Any], key: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"config.json has no positive integer {key}")
    return value


def layout(cfg: dict[str, Any]) -> dict[str, Tensor]:
    """Every tensor of the architecture's Hugging Face checkpoint for ``cfg``, in file order."""
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    family = KNOWN.get(str(arch))
    if family is None:
        raise CheckpointError(f"architecture {arch} is not one this script knows "
                              f"({', '.join(sorted(KNOWN))})")
    awq = _awq(cfg)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or ("float16" if awq else "bfloat16"))
    if dtype not in FLOAT_BYTES:
        raise CheckpointError(f"dtype {dtype} is not one this script writes")
    hidden, inter = _int(cfg, "hidden_size"), _int(cfg, "intermediate_size")
    layers, vocab = _int(cfg, "num_hidden_layers"), _int(cfg, "vocab_size")
    heads = _int(cfg, "num_attention_heads")
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    # the biases and norms vLLM's model class builds (read from its code, not guessed)
    if family == "qwen2":  # qwen2.py: qkv_proj bias=True, o_proj and MLP none; qk_norm optional
        qkv_bias, o_bias, mlp_bias = True, False, False
        qk_norm = bool(cfg.get("qk_norm", False))
    elif family == "qwen3":  # qwen3.py: qkv bias = attention_bias, o_proj none, q/k norms always
        qkv_bias, o_bias, mlp_bias = bool(cfg.get("attention_bias", False)), False, False
        qk_norm = True
    else:  # llama.py: attention_bias (or bias) on q/k/v and o, qkv_bias overrides q/k/v; mlp_bias
        o_bias = bool(cfg.get("attention_bias", False) or cfg.get("bias", False))
        qkv_bias = bool(cfg["qkv_bias"]) if "qkv_bias" in cfg else o_bias
        mlp_bias, qk_norm = bool(cfg.get("mlp_bias", False)), False
    out: dict[str, Tensor] = {"model.embed_tokens.weight": Tensor(dtype, (vocab, hidden), "weight")}

    def linear(name: str, n_in: int, n_out: int, bias: bool) -> None:
        if awq is not None and not any(s in name for s in awq.skip):
            group = n_in if awq.group_size == -1 else awq.group_size
            if n_in % group or n_out % PACK:
                raise CheckpointError(f"{name}: {n_in} x {n_out} does not pack in groups of "
                                      f"{group} and 8 outputs an int32")
            out[f"{name}.qweight"] = Tensor("int32", (n_in, n_out // PACK), "qweight")
            out[f"{name}.qzeros"] = Tensor("int32", (n_in // group, n_out // PACK), "qzeros")
            out[f"{name}.scales"] = Tensor(dtype, (n_in // group, n_out), "scales")
        else:
            out[f"{name}.weight"] = Tensor(dtype, (n_out, n_in), "weight")
        if bias:
            out[f"{name}.bias"] = Tensor(dtype, (n_out,), "bias")

    for i in range(layers):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm.weight"] = Tensor(dtype, (hidden,), "norm")
        linear(f"{p}.self_attn.q_proj", hidden, heads * head_dim, qkv_bias)
        linear(f"{p}.self_attn.k_proj", hidden, kv * head_dim, qkv_bias)
        linear(f"{p}.self_attn.v_proj", hidden, kv * head_dim, qkv_bias)
        linear(f"{p}.self_attn.o_proj", heads * head_dim, hidden, o_bias)
        if qk_norm:
            out[f"{p}.self_attn.q_norm.weight"] = Tensor(dtype, (head_dim,), "norm")
            out[f"{p}.self_attn.k_norm.weight"] = Tensor(dtype, (head_dim,), "norm")
        out[f"{p}.post_attention_layernorm.weight"] = Tensor(dtype, (hidden,), "norm")
        linear(f"{p}.mlp.gate_proj", hidden, inter, mlp_bias)
        linear(f"{p}.mlp.up_proj", hidden, inter, mlp_bias)
        linear(f"{p}.mlp.down_proj", inter, hidden, mlp_bias)
    out["model.norm.weight"] = Tensor(dtype, (hidden,), "norm")
    if not cfg.get("tie_word_embeddings", False):  # the three classes' configs default to untied
        out["lm_head.weight"] = Tensor(dtype, (vocab, hidden), "weight")
    return out


def shards(tensors: dict[str, Tensor], limit: int) -> list[list[str]]:
    """The names in file order, split greedily into files of at most ``limit`` bytes (a tensor
    larger than ``limit`` gets a file of its own)."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        if groups[-1] and size + t.nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += t.nbytes
    return groups


def _draw(t: Tensor, gen: Any, device: str) -> Any:
    import torch

    if t.dtype == "int32":  # random over the whole int32 range: 4 random bytes each
        raw = torch.randint(0, 256, (math.prod(t.shape) * 4,), dtype=torch.uint8,
                            generator=gen, device=device)
        return raw.view(torch.int32).view(t.shape)
    x = torch.empty(t.shape, dtype=torch.float32, device=device)
    if t.kind == "scales":
        x.uniform_(0.001, 0.01, generator=gen)
    elif t.kind == "norm":
        x.uniform_(0.9, 1.1, generator=gen)
    elif t.kind == "bias":
        x.uniform_(-0.02, 0.02, generator=gen)
    else:  # embeddings, lm_head, unquantized linears: a trained checkpoint's spread
        x.normal_(0.0, 0.02, generator=gen)
    return x.to(getattr(torch, t.dtype))


def write(shape_dir: Path, out_dir: Path, seed: int = 0, device: str = "cpu",
          shard_bytes: int = 5 << 30) -> dict[str, Tensor]:
    """OUT_DIR as the module docstring says; returns the layout written."""
    cfg = json.loads((shape_dir / "config.json").read_text())
    tensors = layout(cfg)
    import torch
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    for old in [*out_dir.glob("*.safetensors"), out_dir / INDEX]:
        old.unlink(missing_ok=True)  # no stale shard of an earlier run beside the new ones
    for f in sorted(shape_dir.iterdir()):
        if f.is_file() and f.suffix not in (".md", ".safetensors", ".bin") and f.name != INDEX:
            shutil.copy2(f, out_dir / f.name)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    groups = shards(tensors, shard_bytes)
    n = len(groups)
    weight_map: dict[str, str] = {}
    for k, names in enumerate(groups, 1):
        fname = "model.safetensors" if n == 1 else f"model-{k:05d}-of-{n:05d}.safetensors"
        part = {name: _draw(tensors[name], gen, device).cpu().contiguous() for name in names}
        save_file(part, str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, fname))
        del part
    if n > 1:
        total = sum(t.nbytes for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return tensors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("shape_dir", type=Path)
    ap.add_argument("out_dir", type=Path, nargs="?")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="where the values are drawn (cuda: faster)")
    ap.add_argument("--shard-gib", type=float, default=5.0, help="largest file, GiB")
    ap.add_argument("--list", action="store_true", help="print the layout, write nothing")
    args = ap.parse_args(argv)
    try:
        if args.list:
            cfg = json.loads((args.shape_dir / "config.json").read_text())
            tensors = layout(cfg)
            for name, t in tensors.items():
                print(f"{name} {t.dtype} {list(t.shape)}")
        else:
            if args.out_dir is None:
                ap.error("OUT_DIR is needed (or --list)")
            tensors = write(args.shape_dir, args.out_dir, args.seed, args.device,
                            int(args.shard_gib * (1 << 30)))
    except (CheckpointError, OSError, ValueError) as exc:
        print(f"random_checkpoint: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    total = sum(t.nbytes for t in tensors.values())
    print(f"{len(tensors)} tensors, {total / (1 << 30):.2f} GiB"
          + ("" if args.list else f" -> {args.out_dir}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
