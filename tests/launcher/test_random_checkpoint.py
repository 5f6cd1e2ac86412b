"""benchmarks/gpu/random_checkpoint.py: the random checkpoint a GPU table serves in place of vLLM's
dummy weights holds exactly the tensors a Hugging Face checkpoint of the architecture has.

The expected names are written out here from the architectures' checkpoints (AutoAWQ's GEMM
layout for a 4-bit linear), independently of the script's own layout function."""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "random_checkpoint.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("random_checkpoint", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


RC = _module()


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    arch = draw(st.sampled_from(["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]))
    group = draw(st.sampled_from([32, 64, 128]))
    kv = draw(st.sampled_from([1, 2, 4]))
    heads = kv * draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from([32, 64]))
    while heads * head_dim % group:  # o_proj's input packs in whole groups, as real shapes do
        heads *= 2
    cfg: dict[str, Any] = {
        "architectures": [arch],
        "num_hidden_layers": draw(st.integers(1, 3)),
        "hidden_size": group * draw(st.integers(1, 3)),
        "intermediate_size": group * draw(st.integers(1, 4)),
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "vocab_size": draw(st.sampled_from([64, 256])),
        "tie_word_embeddings": draw(st.booleans()),
        "attention_bias": draw(st.booleans()),
        "torch_dtype": "float16",
    }
    if draw(st.booleans()):
        cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group,
                                      "zero_point": True, "version": "gemm",
                                      "modules_to_not_convert": draw(st.sampled_from(
                                          [None, ["down_proj"], ["layers.0.self_attn"]]))}
    return cfg


def expected(cfg: dict[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (safetensors dtype, shape) of the Hugging Face checkpoint of ``cfg``."""
    arch = cfg["architectures"][0]
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    vocab = cfg["vocab_size"]
    qc = cfg.get("quantization_config")
    bias = {"Qwen2ForCausalLM": True}.get(arch, cfg["attention_bias"])
    o_bias = arch == "LlamaForCausalLM" and cfg["attention_bias"]
    out: dict[str, tuple[str, tuple[int, ...]]] = {"model.embed_tokens.weight": ("F16", (vocab, h))}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm.weight"] = ("F16", (h,))
        out[f"{p}.post_attention_layernorm.weight"] = ("F16", (h,))
        if arch == "Qwen3ForCausalLM":
            out[f"{p}.self_attn.q_norm.weight"] = ("F16", (hd,))
            out[f"{p}.self_attn.k_norm.weight"] = ("F16", (hd,))
        for name, n_in, n_out, b in (
                ("self_attn.q_proj", h, q, bias), ("self_attn.k_proj", h, kv, bias),
                ("self_attn.v_proj", h, kv, bias), ("self_attn.o_proj", q, h, o_bias),
                ("mlp.gate_proj", h, inter, False), ("mlp.up_proj", h, inter, False),
                ("mlp.down_proj", inter, h, False)):
            full = f"{p}.{name}"
            if qc is None or any(s in full for s in qc["modules_to_not_convert"] or ()):
                out[f"{full}.weight"] = ("F16", (n_out, n_in))
            else:
                g = qc["group_size"]
                out[f"{full}.qweight"] = ("I32", (n_in, n_out // 8))
                out[f"{full}.qzeros"] = ("I32", (n_in // g, n_out // 8))
                out[f"{full}.scales"] = ("F16", (n_in // g, n_out))
            if b:
                out[f"{full}.bias"] = ("F16", (n_out,))
    out["model.norm.weight"] = ("F16", (h,))
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = ("F16", (vocab, h))
    return out


def _written(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) of every tensor in the folder's safetensors files, read from their
    headers; the index, where there is one, must name exactly those tensors and files."""
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    where: dict[str, str] = {}
    for f in sorted(folder.glob("*.safetensors")):
        raw = f.read_bytes()
        header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
        for name, info in header.items():
            if name != "__metadata__":
                assert name not in tensors, f"{name} in two files"
                tensors[name] = (info["dtype"], tuple(info["shape"]))
                where[name] = f.name
    index = folder / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        assert data["weight_map"] == where
    else:
        assert [f.name for f in folder.glob("*.safetensors")] == ["model.safetensors"]
    return tensors


def _shape_dir(root: Path, cfg: dict[str, Any]) -> Path:
    shape = root / "shape"
    shape.mkdir()
    (shape / "config.json").write_text(json.dumps(cfg))
    (shape / "tokenizer.json").write_text("{}")
    (shape / "SOURCE.md").write_text("where the config came from")
    return shape


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), shard_kib=st.sampled_from([None, 64]))
def test_checkpoint_holds_exactly_the_architectures_tensors(cfg: dict[str, Any],
                                                           shard_kib: int | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        shape = _shape_dir(Path(tmp), cfg)
        out = Path(tmp) / "ckpt"
        limit = (shard_kib << 10) if shard_kib else (5 << 30)
        RC.write(shape, out, seed=3, shard_bytes=limit)
        assert _written(out) == expected(cfg)
        # the config and tokenizer travel with the weights; the shape's notes do not
        assert json.loads((out / "config.json").read_text()) == cfg
        assert (out / "tokenizer.json").exists()
        assert not (out / "SOURCE.md").exists()


def test_index_total_size_is_the_tensor_bytes_and_a_rewrite_leaves_no_stale_shard(
        tmp_path: Path) -> None:
    cfg = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2, "hidden_size": 128,
           "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
           "head_dim": 64, "vocab_size": 256, "tie_word_embeddings": False,
           "torch_dtype": "float16",
           "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,
                                   "zero_point": True, "version": "gemm"}}
    shape = _shape_dir(tmp_path, cfg)
    out = tmp_path / "ckpt"
    RC.write(shape, out, shard_bytes=32 << 10)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    sizes = {"I32": 4, "F16": 2}
    total = 0
    for dtype, shape_ in _written(out).values():
        n = sizes[dtype]
        for d in shape_:
            n *= d
        total += n
    assert index["metadata"]["total_size"] == total
    assert len(set(index["weight_map"].values())) > 1
    RC.write(shape, out)  # one file now: the shards and index of the first run are gone
    assert sorted(f.name for f in out.glob("*.safetensors")) == ["model.safetensors"]
    assert not (out / "model.safetensors.index.json").exists()


def test_packed_integers_cover_the_int32_range_and_scales_are_small(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "hidden_size": 256,
           "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 64, "torch_dtype": "float16",
           "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,
                                   "zero_point": True, "version": "gemm"}}
    shape = _shape_dir(tmp_path, cfg)
    RC.write(shape, tmp_path / "ckpt", seed=5)
    t = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    qw = t["model.layers.0.mlp.gate_proj.qweight"]
    # not the zeros vLLM's dummy loader leaves: both signs, every nibble value in the low one
    assert int(qw.min()) < -(1 << 30)
    assert int(qw.max()) > (1 << 30)
    assert len(set((qw & 0xF).flatten().tolist())) == 16
    assert int((t["model.layers.0.mlp.gate_proj.qzeros"] != 0).sum()) > 0
    scales = t["model.layers.0.mlp.gate_proj.scales"].float()
    assert float(scales.min()) > 0.0009
    assert float(scales.max()) < 0.0101
    # same seed, same checkpoint (a table's case is reproducible)
    RC.write(shape, tmp_path / "ckpt2", seed=5)
    assert bool((load_file(str(tmp_path / "ckpt2" / "model.safetensors"))[
        "model.layers.0.mlp.gate_proj.qweight"] == qw).all())


@pytest.mark.parametrize(("cfg", "words"), [
    ({"architectures": ["Qwen3MoeForCausalLM"]},
     "Qwen3MoeForCausalLM is not one this script knows"),
    ({}, "architecture None is not one this script knows"),
    ({"architectures": ["LlamaForCausalLM"], "quantization_config": {"quant_method": "gptq"}},
     "quantization gptq"),
    ({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 1, "hidden_size": 96,
      "intermediate_size": 128, "num_attention_heads": 1, "head_dim": 96, "vocab_size": 64,
      "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}},
     "q_proj: 96 x 96 does not pack in groups of 128"),
])
def test_unknown_architecture_or_quantization_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], cfg: dict[str, Any],
        words: str) -> None:
    shape = _shape_dir(tmp_path, cfg)
    assert RC.main([str(shape), str(tmp_path / "ckpt")]) == 2
    err = capsys.readouterr().err
    assert words in err
    assert err.count("\n") == 1
    assert not (tmp_path / "ckpt").exists()
