"""A checkpoint whose quantization config asks for an FP8 KV cache (ModelOpt's
``kv_cache_quant_algo`` / ``kv_cache_scheme``, compressed-tensors' ``kv_cache_scheme``) is
planned with the KV dtype the served vLLM's ``--kv-cache-dtype auto`` resolves it to: fp8 on
0.32 (utils/torch_utils.resolve_kv_cache_dtype_string), 2 bytes with a reason where the
release's rule is not known; the user's own --kv-cache-dtype always wins."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli.planopts import engine_memory_flags
from launcher.model import quantization
from launcher.model.families import ServedVllm
from launcher.model.modelspec import ModelSpec, spec_from_config
from launcher.planner.agent import AgentAsk, agent_plan
from launcher.planner.kvdtype import checkpoint_kv
from launcher.planner.plan import Plan, Policy, plan
from launcher.probe.topology import load_topology
from tests.launcher.paths import model, topo

# Llama-3.1-8B with a context far past what two H200s hold: the plan is KV-bound
LLAMA = {**json.loads(Path(model("llama-3.1-8b"), "config.json").read_text()),
         "max_position_embeddings": 1 << 24}
PAIR = topo("h200x2-nvlink")
V032 = ServedVllm("0.32.0", "TOPOSERVE_VLLM_VERSION")
UNKNOWN = ServedVllm("", "a CPU build of vLLM")
FP8_SCHEME = {"dynamic": False, "num_bits": 8, "type": "float"}


def side_file(**kv: Any) -> dict[str, Any]:
    """hf_quant_config.json as ModelOpt writes it, with the KV keys given."""
    return {"producer": {"name": "modelopt", "version": "0.29.0"},
            "quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"], **kv}}


def spec(q: dict[str, Any]) -> ModelSpec:
    return spec_from_config({**LLAMA, "quantization_config": q}, "generated")


def planned(m: ModelSpec, policy: Policy) -> Plan:
    """The plan of ``m``, its policy's KV dtype resolved first, as pipeline.run.choose hands it."""
    return plan(load_topology(PAIR, {}), m, checkpoint_kv(policy, m))


def held(m: ModelSpec, policy: Policy) -> int:
    """KV tokens the plan's context is: KV-bound here, so the cache's tokens."""
    return planned(m, policy).max_model_len


def test_a_modelopt_fp8_kv_checkpoint_on_vllm_032_holds_twice_the_kv_tokens() -> None:
    asks, plain = spec(side_file(kv_cache_quant_algo="FP8")), spec(side_file())
    assert (asks.kv_cache_quantized, plain.kv_cache_quantized) == (1, None)
    on032 = Policy(vllm=V032)
    with_fp8, without = held(asks, on032), held(plain, on032)
    assert 1.8 * without < with_fp8 < 2.2 * without
    p = planned(asks, on032)
    assert any(r.startswith("FP8 KV cache: the checkpoint's quantization config asks")
               for r in p.reasons)
    assert not any("your vLLM flag" in r for r in p.reasons)


def test_an_unknown_vllm_release_keeps_2_bytes_and_says_fp8_would_double_the_context() -> None:
    asks, plain = spec(side_file(kv_cache_quant_algo="FP8")), spec(side_file())
    for served in (UNKNOWN, ServedVllm()):  # none read, and 0.26 (its rule not read)
        policy = Policy(vllm=served)
        assert held(asks, policy) == held(plain, policy)
        p = planned(asks, policy)
        assert any("asks for an FP8 KV cache" in r and "--kv-cache-dtype fp8" in r
                   and "double the context" in r for r in p.reasons), p.reasons
        assert not any("asks for an FP8 KV cache" in r
                       for r in planned(plain, policy).reasons)


def test_the_users_own_kv_cache_dtype_wins_over_the_checkpoints() -> None:
    asks = spec(side_file(kv_cache_quant_algo="FP8"))
    bf16 = Policy(vllm=V032, kv_cache_given=True)  # -- --kv-cache-dtype bfloat16
    assert checkpoint_kv(bf16, asks) is bf16
    assert held(asks, bf16) == held(spec(side_file()), Policy(vllm=V032))
    assert engine_memory_flags(["--kv-cache-dtype", "bfloat16"])[0] == 2


def test_the_agent_planner_offers_no_second_fp8_kv_and_renders_no_flag_for_it() -> None:
    # auto already gives the FP8 cache on 0.32: an FP8 option would count it twice
    asks = spec(side_file(kv_cache_quant_algo="FP8"))
    t = load_topology(PAIR, {})
    policy = checkpoint_kv(Policy(vllm=V032), asks)
    assert policy.kv_cache_bytes == 1
    assert not policy.kv_cache_given
    base = plan(t, asks, replace(policy, concurrency=4))
    ap = agent_plan(t, asks, policy, base, AgentAsk(4, 65536), 64 << 30)
    assert not any("--kv-cache-dtype" in f.words for f in ap.flags)
    assert not any("your --kv-cache-dtype" in r for r in ap.reasons)
    fp8 = next(o for o in ap.options if o.name == "fp8")
    assert "already in use (the checkpoint asks for it" in fp8.reason


def test_config_json_forms_are_read_where_vllm_reads_them() -> None:
    # ModelOpt 0.31+: the block copied into config.json, or its compressed-tensors-like form
    inline = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_scheme": FP8_SCHEME}
    assert spec(inline).kv_cache_quantized == 1
    ct = {"quant_method": "compressed-tensors", "config_groups": {},
          "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}
    assert spec(ct).kv_cache_quantized == 1
    assert spec({**ct, "kv_cache_scheme": None}).kv_cache_quantized is None
    # vLLM does not take a scheme computed at run time as ModelOpt's FP8 cache
    assert spec(side_file(kv_cache_scheme={**FP8_SCHEME, "dynamic": True})) \
        .kv_cache_quantized is None


def test_an_nvfp4_or_unknown_kv_setting_is_sized_at_2_bytes_with_a_note() -> None:
    for kv in ("NVFP4", "INT8", {"num_bits": 4, "type": "float"}, ["FP8"]):
        m = spec(side_file(kv_cache_quant_algo=kv))
        assert m.kv_cache_quantized is None
        assert any("KV sized at 2 bytes" in n for n in m.notes), (kv, m.notes)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-9, 9) | st.floats(allow_nan=False)
                    | st.sampled_from(["FP8", "fp8", "NVFP4", "float", "int", ""]),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["num_bits", "type", "dynamic",
                                                       "strategy"]), inner, max_size=4),
                    max_leaves=8)
KEYS = st.sampled_from(["kv_cache_quant_algo", "kv_cache_scheme"])


@settings(max_examples=300, deadline=None)
@given(where=st.sampled_from(["block", "top", "compressed-tensors", "modelopt"]), key=KEYS,
       value=JSON, block=st.one_of(JSON, st.just({"quant_algo": "FP8"})))
def test_any_kv_config_is_read_without_failing_and_only_fp8_is_one_byte(
        where: str, key: str, value: Any, block: Any) -> None:
    if where == "block":
        q: dict[str, Any] = side_file(**{key: value})
    elif where == "top":
        q = {"producer": {"name": "modelopt"}, "quantization": block, key: value}
    elif where == "compressed-tensors":
        q = {"quant_method": "compressed-tensors", "kv_cache_scheme": value}
    else:
        q = {"quant_method": "modelopt", "quant_algo": "FP8", key: value}
    got, notes = quantization.kv_cache_quantized({"quantization_config": q}, {})
    assert got in (None, 1)
    assert all(isinstance(n, str) for n in notes)
    if got == 1:  # only a form vLLM 0.32 resolves to fp8
        found = [v for v in (q.get("quantization"), q) if isinstance(v, dict)]
        values = [d.get(k) for d in found for k in ("kv_cache_scheme", "kv_cache_quant_algo")]
        assert any(v == "FP8" or v == "fp8" or (isinstance(v, dict) and v.get("num_bits") == 8
                                                and v.get("type") == "float") for v in values)
