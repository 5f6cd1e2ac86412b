"""`launcher model`: what a model needs (parameters, weights, KV cache per token)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from launcher.cli import argtypes
from launcher.model.modelspec import GIB, ModelSpec, load_model_spec

CONTEXTS = (4096, 8192, 32768, 131072)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("model", help="size a model from its config.json")
    p.add_argument(
        "--model", required=True, type=argtypes.model_ref,
        help="local model folder, or Hugging Face id (org/name: config fetched, or read from "
        "the cache offline)",
    )
    p.add_argument("--revision", type=argtypes.nonempty,
                   help="branch, tag or commit of a hub model (default: main)")
    p.add_argument("--json", action="store_true",
                   help="print the model's whole reading as one JSON object instead of the summary")
    p.set_defaults(func=run)


def format_model(m: ModelSpec) -> str:
    quant = f"{m.quantization}, {m.weight_bits:g}-bit linear layers" if m.quantization else m.dtype
    lines = [
        f"{m.name}: {m.architecture} ({m.family})",
        f"  layers {m.num_layers}, hidden {m.hidden_size}, heads {m.num_heads} "
        f"(KV {m.num_kv_heads}, "
        f"head dim {m.head_dim}), vocab {m.vocab_size}, context {m.max_position_embeddings}",
        f"  parameters {m.params / 1e9:.2f}B"
        + (
            f" ({m.active_params / 1e9:.2f}B active, {m.num_experts} experts)"
            if m.num_experts
            else ""
        ),
        f"  weights {m.weight_bytes / GIB:.1f} GiB ({quant})",
        f"  KV cache {m.kv_bytes_per_layer_token() * m.num_layers / 1024:.0f} KiB/token at 16 bits"
        + (
            f"; {m.sliding_layers} sliding-window layers keep only {m.sliding_window} tokens"
            if m.sliding_layers
            else ""
        )
        + (
            f"; {m.chunked_layers} chunked-attention layers keep at most one "
            f"{m.attention_chunk}-token chunk"
            if m.chunked_layers
            else ""
        ),
    ]
    lines += [f"  note: {n}" for n in m.notes]
    for ctx in (c for c in CONTEXTS if c <= m.max_position_embeddings):
        lines.append(
            f"  one sequence of {ctx:>6} tokens: {m.kv_bytes(ctx) / GIB:6.2f} GiB of KV cache"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    m = load_model_spec(args.model, revision=args.revision)
    print(json.dumps(asdict(m), indent=1) if args.json else format_model(m))
    return 0
