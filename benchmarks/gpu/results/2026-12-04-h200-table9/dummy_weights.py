"""Does the H200's 4-bit GEMM (vLLM's Machete, as the engine and the probe run it) take
longer on random packed weights (the probe's, and a real checkpoint's) than on the zeros
vLLM's dummy loader leaves in integer parameters? And a bf16 control (zeros vs random)."""
import functools, statistics, sys, time
from unittest import mock
import torch
from launcher.probe import kernels as K

ops = K._Ops(torch, "cuda", "float16")
budget = K.Budget()
try:
    from vllm.model_executor.kernels.linear import MPLinearLayerConfig, choose_mp_linear_kernel
except ImportError:
    from vllm.model_executor.layers.quantization.kernels.mixed_precision import MPLinearLayerConfig, choose_mp_linear_kernel
from vllm.model_executor.parameter import GroupQuantScaleParameter, PackedvLLMParameter
from vllm.scalar_type import scalar_types
import vllm.model_executor.parameter as vparam

def rand_ints(*shape):
    return torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32, device="cuda")
def zero_ints(*shape):
    return torch.zeros(shape, dtype=torch.int32, device="cuda")

def layer(k, n, ints, scale):
    lin = K.Linear("x", k, n, 4)
    cfg = MPLinearLayerConfig(full_weight_shape=(k, n), partition_weight_shape=(k, n),
                              weight_type=scalar_types.uint4, act_type=torch.float16,
                              group_size=128, zero_points=True,
                              **{f.name: False for f in __import__("dataclasses").fields(MPLinearLayerConfig) if f.name == "has_g_idx"})
    kind = choose_mp_linear_kernel(cfg)
    with (mock.patch.object(vparam, "get_tensor_model_parallel_rank", return_value=0),
          mock.patch.object(vparam, "get_tensor_model_parallel_world_size", return_value=1)):
        mod = torch.nn.Module()
        mod.qweight = PackedvLLMParameter(data=ints(k // 8, n), input_dim=0, output_dim=1, packed_dim=0, packed_factor=8, weight_loader=lambda *a, **b: None)
        mod.scales = GroupQuantScaleParameter(data=scale(k // 128, n), input_dim=0, output_dim=1, weight_loader=lambda *a, **b: None)
        mod.qzeros = PackedvLLMParameter(data=ints(k // 128, n // 8), input_dim=0, output_dim=1, packed_dim=1, packed_factor=8, weight_loader=lambda *a, **b: None)
        kern = kind(cfg, w_q_param_name="qweight", w_s_param_name="scales", w_zp_param_name="qzeros")
        kern.process_weights_after_loading(mod)
    return functools.partial(kern.apply_weights, mod), kind.__name__

def t(fn):
    return K._graph_call_s(torch, fn, budget)

print(torch.cuda.get_device_name(), flush=True)
for k, n in ((5120, 51200), (25600, 5120), (5120, 10240)):
    for tokens in (512, 8192):
        x = torch.randn(tokens, k, device="cuda", dtype=torch.float16)
        xs = (torch.rand(tokens, k, device="cuda", dtype=torch.float16) - 0.5) * 2e-3
        res = {}
        for name, ints, scale, xx in (("random (probe)", rand_ints, lambda *s: torch.randn(*s, device="cuda", dtype=torch.float16) * 0.01, x),
                                      ("zeros, dummy scales", zero_ints, lambda *s: (torch.rand(*s, device="cuda", dtype=torch.float16) - 0.5) * 2e-3, x),
                                      ("zeros, dummy scales, tiny x", zero_ints, lambda *s: (torch.rand(*s, device="cuda", dtype=torch.float16) - 0.5) * 2e-3, xs)):
            fn, kname = layer(k, n, ints, scale)
            s = statistics.median([t(lambda: fn(xx)) for _ in range(3)])
            res[name] = s
        base = res["random (probe)"]
        tf = 2 * tokens * k * n / base / 1e12
        print(f"{kname} k={k} n={n} tokens={tokens}: " + ", ".join(f"{a} {v*1e6:.1f} us (x{v/base:.3f})" for a, v in res.items()) + f"; random = {tf:.0f} TFLOP/s", flush=True)
# bf16 control
for tokens in (8192,):
    k, n = 5120, 51200
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16); z = torch.zeros_like(w)
    ws = (torch.rand(n, k, device="cuda", dtype=torch.bfloat16) - 0.5) * 2e-3
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    r = {nm: statistics.median([t(lambda: torch.nn.functional.linear(x, ww)) for _ in range(3)]) for nm, ww in (("randn", w), ("zeros", z), ("dummy uniform 1e-3", ws))}
    print("bf16 linear 8192x5120x51200: " + ", ".join(f"{a} {v*1e6:.1f} us (x{v/r['randn']:.3f})" for a, v in r.items()), flush=True)
