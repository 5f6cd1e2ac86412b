"""A checkpoint's quantization_config, as the planner needs it: the method, the bits per weight
of the quantized layers, and the bytes of scales and zero points per weight. Pure, total: any
config, of any shape, gives an answer (see :func:`read`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def read(cfg: Mapping[str, Any], t: Mapping[str, Any]) -> tuple[str | None, float, float]:
    """(method, bits per weight of linear layers, overhead bytes per weight for scales/zeros).

    Any quantization_config is read without failing: fields of the wrong type or out of range
    count as absent, and a method this reader does not know keeps 16 bits (the larger size, and
    the checkpoint's own size replaces it where a safetensors index gives one)."""
    q = cfg.get("quantization_config") or t.get("quantization_config")
    if not isinstance(q, Mapping):
        return None, 16.0, 0.0
    method = str(q.get("quant_method", "unknown")).lower()
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        bits = _number(q.get("bits", q.get("w_bit")), 4.0, 1, 16)
        group = int(_number(q.get("group_size", q.get("q_group_size")), 128.0, -1, 1 << 20))
        group = group if group > 0 else 4096  # -1 means one group per output channel
        # one fp16 scale and one packed zero point per group
        return method.split("_")[0], bits, (2 + bits / 8) / group
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", 8.0, 0.0
    if method == "mxfp4":
        # OCP MX: 4-bit values and one 8-bit shared scale per 32 (gpt-oss quantizes only its
        # experts this way; spec_from_config keeps the other layers at 16 bits)
        return "mxfp4", 4.0, 1 / 32
    if method == "modelopt":  # NVIDIA ModelOpt: quant_algo FP8, or NVFP4 (an FP8 scale per 16)
        algo = str(q.get("quant_algo") or "").upper()
        if "NVFP4" in algo or "FP4" in algo:
            return "modelopt", 4.0, 1 / 16
        if "FP8" in algo:
            return "modelopt", 8.0, 0.0
        return "modelopt", 16.0, 0.0
    if method == "bitsandbytes":
        return "bitsandbytes", 4.0 if q.get("load_in_4bit") is True else 8.0, 0.0
    if method == "compressed-tensors":
        bits = 16.0
        groups = q.get("config_groups")
        for group in groups.values() if isinstance(groups, Mapping) else ():
            w = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(w, Mapping):
                bits = min(bits, _number(w.get("num_bits"), 16.0, 1, 16))
        return "compressed-tensors", bits, 0.0
    return method, 16.0, 0.0


def _number(value: Any, default: float, low: float, high: float) -> float:
    """``value`` as a number within [low, high], else ``default`` (configs are not checked)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value) if low <= value <= high else default
