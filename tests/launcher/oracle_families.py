"""Tiny random-weight models of every family the planner names, made with transformers' own code.

Each keeps its family's structure (grouped-query attention, sliding-window layers and their
pattern, mixture-of-experts routing, Gemma 4's shared-KV layers, keys equal to values and
per-layer input embeddings, tied or untied embeddings, Qwen2's biases, Qwen3's q/k norms) at a
size two CPU cores load in seconds. The planner sizes the same config.json that vLLM loads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ORACLE_VERSION = 1  # bump when a family below changes, so cached models are rebuilt

# Shared tiny dimensions: head sizes vLLM's CPU attention supports (64, 128).
_BASE: dict[str, Any] = {
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
_G4_TYPES = ["sliding_attention"] * 2 + ["full_attention"]

FAMILIES: dict[str, dict[str, Any]] = {
    "llama3": {
        **_BASE,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 3,
        "tie_word_embeddings": False,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 1024,
            "rope_type": "llama3",
        },
    },
    "llama3-tied": {  # Llama 3.2 1B/3B tie the LM head to the embedding
        **_BASE,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 2,
        "tie_word_embeddings": True,
    },
    "mistral": {
        **_BASE,
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "num_hidden_layers": 3,
        "sliding_window": None,
        "tie_word_embeddings": False,
    },
    "qwen2.5": {
        **_BASE,
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "num_hidden_layers": 3,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 3,
    },
    "qwen2-moe": {
        **_BASE,
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "num_hidden_layers": 2,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 256,
        "decoder_sparse_step": 1,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
    },
    "qwen3": {
        **_BASE,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_hidden_layers": 3,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
    },
    "qwen3-moe": {
        **_BASE,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_hidden_layers": 2,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
    },
    "mixtral": {  # Mistral's mixture of experts (Mixtral 8x7B, 8x22B)
        **_BASE,
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_hidden_layers": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    },
    "deepseek-v2": {  # multi-head latent attention (one cached vector per token), shared experts
        **_BASE,
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "num_hidden_layers": 3,
        "num_key_value_heads": 4,
        "kv_lora_rank": 64,
        "q_lora_rank": None,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 64,
        "v_head_dim": 64,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "greedy",
        "norm_topk_prob": False,
        "scoring_func": "softmax",
        "routed_scaling_factor": 1.0,
        "tie_word_embeddings": False,
    },
    "gemma2": {  # every other layer local
        **_BASE,
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "num_hidden_layers": 4,
        "sliding_window": 256,
        "query_pre_attn_scalar": 64,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "gemma3": {  # five local layers, then one global
        **_BASE,
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "num_hidden_layers": 6,
        "sliding_window": 256,
        "query_pre_attn_scalar": 64,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    },
    "gemma4": {  # shared-KV layers, keys equal values on global layers, per-layer inputs
        **_BASE,
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "num_hidden_layers": 6,
        "layer_types": _G4_TYPES * 2,
        "sliding_window": 256,
        "global_head_dim": 128,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "num_kv_shared_layers": 2,
        "hidden_size_per_layer_input": 32,
        "vocab_size_per_layer_input": 2048,
        "final_logit_softcapping": 30.0,
        "enable_moe_block": False,
    },
    "gemma4-moe": {  # the 26B-A4B's shape: a dense MLP beside routed experts in every layer
        **_BASE,
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "num_hidden_layers": 3,
        "layer_types": _G4_TYPES,
        "sliding_window": 256,
        "global_head_dim": 128,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 0,
        "enable_moe_block": True,
        "num_experts": 8,
        "top_k_experts": 2,
        "moe_intermediate_size": 128,
        "final_logit_softcapping": 30.0,
    },
}


def build(name: str, cfg: Mapping[str, Any], out: Path) -> Path:
    """Write ``cfg``'s model with random weights (fixed seed) through transformers' saving code."""
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    done = out / ".oracle-version"
    if done.is_file() and done.read_text() == str(ORACLE_VERSION):
        return out
    d = dict(cfg)
    conf = CONFIG_MAPPING[d.pop("model_type")](**{k: v for k, v in d.items() if k != "torch_dtype"})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # Keep the config as written above, fields and all (save_pretrained may drop defaults).
    written = json.loads((out / "config.json").read_text())
    written.update({k: v for k, v in cfg.items() if k != "torch_dtype"})
    written["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(written, indent=1))
    done.write_text(str(ORACLE_VERSION))
    return out



def write_spec(root: Path, kv_bytes: int, batched: int, max_seqs: int) -> None:
    """oracle_probe.py's SPEC.json for the families built under ``root``: each with the context
    the planner plans for a KV cache of ``kv_bytes``."""
    from launcher.model.modelspec import load_model_spec
    from launcher.planner import memfit

    specs = []
    for name in FAMILIES:
        path = root / name
        m = load_model_spec(str(path))
        specs.append(
            {
                "name": name,
                "path": str(path),
                "max_model_len": memfit.cpu_context(m, kv_bytes, batched),
                "kv_bytes": kv_bytes,
                "batched_tokens": batched,
                "max_num_seqs": max_seqs,
            }
        )
    (root / "spec.json").write_text(json.dumps(specs))


def main(argv: list[str]) -> int:
    """``python -m tests.launcher.oracle_families ROOT KV_BYTES BATCHED MAX_SEQS``: every family
    under ROOT/<name> and ROOT/spec.json, in a process of its own (the oracle's start runs
    beside other tests: transformers' building and the planner's sizing stay out of their
    process; see test_oracle_cpu.py)."""
    root = Path(argv[0])
    for name, cfg in FAMILIES.items():
        build(name, cfg, root / name)
    write_spec(root, int(argv[1]), int(argv[2]), int(argv[3]))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
