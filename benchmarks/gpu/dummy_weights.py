"""Do vLLM's dummy weights (``--load-format dummy``) run the engine's GEMMs as fast as a real
checkpoint's? A 4-bit layer's integer parameters (packed weights, zero points) are left as
``torch.empty`` by vLLM's dummy loader (zeros on a fresh card), its scales uniform in +-1e-3;
``probe --measure --model`` times the same kernel on random packed weights, as a checkpoint's.
Each GEMM here is timed as the probe times it (launcher.probe.kernels: vLLM's
``choose_mp_linear_kernel``, replayed from a CUDA graph), both ways, and a bf16 control.

    PYTHONPATH=/root/site:$PWD python3 benchmarks/gpu/dummy_weights.py     (on the GPU machine)

Results: results/2026-12-04-h200-table9/dummy-weights.txt.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable
from typing import Any
from unittest import mock

import torch

from launcher.probe import kernels as K

SHAPES = ((5120, 51200), (25600, 5120), (5120, 10240))  # Qwen3-32B's gate_up, down, qkv
TOKENS = (512, 8192)


def _imports() -> tuple[Any, Any]:
    try:  # vLLM 0.32's path, also the 0.26 bundle's
        from vllm.model_executor.kernels.linear import (
            MPLinearLayerConfig,
            choose_mp_linear_kernel,
        )
    except ImportError:
        from vllm.model_executor.layers.quantization.kernels.mixed_precision import (
            MPLinearLayerConfig,
            choose_mp_linear_kernel,
        )
    return MPLinearLayerConfig, choose_mp_linear_kernel


def _layer(k: int, n: int, ints: Callable[..., Any],
           scale: Callable[..., Any]) -> tuple[Callable[[Any], object], str]:
    """One 4-bit layer (groups of 128, zero points), made ready by the kernel itself."""
    import vllm.model_executor.parameter as vparam
    from vllm.model_executor.parameter import GroupQuantScaleParameter, PackedvLLMParameter
    from vllm.scalar_type import scalar_types

    config, choose = _imports()
    extra = {f.name: False for f in dataclasses.fields(config) if f.name == "has_g_idx"}
    cfg = config(full_weight_shape=(k, n), partition_weight_shape=(k, n),
                 weight_type=scalar_types.uint4, act_type=torch.float16, group_size=128,
                 zero_points=True, **extra)
    kind = choose(cfg)

    def no_load(*_: Any, **__: Any) -> None:
        return None

    with (mock.patch.object(vparam, "get_tensor_model_parallel_rank", return_value=0),
          mock.patch.object(vparam, "get_tensor_model_parallel_world_size", return_value=1)):
        mod = torch.nn.Module()
        mod.qweight = PackedvLLMParameter(data=ints(k // 8, n), input_dim=0, output_dim=1,
                                          packed_dim=0, packed_factor=8, weight_loader=no_load)
        mod.scales = GroupQuantScaleParameter(data=scale(k // 128, n), input_dim=0,
                                              output_dim=1, weight_loader=no_load)
        mod.qzeros = PackedvLLMParameter(data=ints(k // 128, n // 8), input_dim=0,
                                         output_dim=1, packed_dim=1, packed_factor=8,
                                         weight_loader=no_load)
        kernel = kind(cfg, w_q_param_name="qweight", w_s_param_name="scales",
                      w_zp_param_name="qzeros")
        kernel.process_weights_after_loading(mod)
    return functools.partial(kernel.apply_weights, mod), kind.__name__


def _timed(call: Callable[[], object]) -> float:
    got = [K._graph_call_s(torch, call, K.Budget()) for _ in range(3)]
    return statistics.median(g for g in got if g is not None)


def main() -> None:
    def random_ints(*shape: int) -> Any:
        return torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32, device="cuda")

    def zero_ints(*shape: int) -> Any:
        return torch.zeros(shape, dtype=torch.int32, device="cuda")

    def probe_scales(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", dtype=torch.float16) * 0.01

    def dummy(*shape: int, dtype: Any = torch.float16) -> Any:
        return (torch.rand(*shape, device="cuda", dtype=dtype) - 0.5) * 2e-3

    print(torch.cuda.get_device_name(), flush=True)
    for k, n in SHAPES:
        for tokens in TOKENS:
            x = torch.randn(tokens, k, device="cuda", dtype=torch.float16)
            ways = (("random (probe)", random_ints, probe_scales, x),
                    ("zeros, dummy scales", zero_ints, dummy, x),
                    ("zeros, dummy scales, tiny x", zero_ints, dummy, dummy(tokens, k)))
            got: dict[str, float] = {}
            name = ""
            for way, ints, scale, xx in ways:
                fn, name = _layer(k, n, ints, scale)
                got[way] = _timed(functools.partial(fn, xx))
            base = got["random (probe)"]
            rate = 2 * tokens * k * n / base / 1e12
            print(f"{name} k={k} n={n} tokens={tokens}: "
                  + ", ".join(f"{w} {s * 1e6:.1f} us (x{s / base:.3f})" for w, s in got.items())
                  + f"; random = {rate:.0f} TFLOP/s", flush=True)
    k, n, tokens = 5120, 51200, 8192
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    weights = {"randn": torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
               "zeros": torch.zeros(n, k, device="cuda", dtype=torch.bfloat16),
               "dummy uniform 1e-3": dummy(n, k, dtype=torch.bfloat16)}
    bf16 = {w: _timed(functools.partial(torch.nn.functional.linear, x, t))
            for w, t in weights.items()}
    print(f"bf16 linear {tokens}x{k}x{n}: "
          + ", ".join(f"{w} {s * 1e6:.1f} us (x{s / bf16['randn']:.3f})" for w, s in bf16.items()),
          flush=True)


if __name__ == "__main__":
    main()
