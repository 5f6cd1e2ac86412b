"""Which dashboard queries the CPU test stack cannot feed, and why; every other query must return
data in test_dashboard_queries.py. test_dashboard.py checks these lists name exactly the queries
that read GPU metrics, so a new GPU panel cannot slip through unlisted.
"""

from __future__ import annotations

# Panels fed by the GPU collector (NVML) only: no series exist on a machine without GPUs.
GPU_ONLY_PANELS = frozenset(
    {
        "GPU utilisation",
        "GPU power",
        "GPU memory used",
        "PCIe throughput (rx negative)",
        "NVLink throughput (rx negative)",
    }
)
GPU_ONLY_RULES = frozenset(
    {
        "gpu:toposerve_gpu_nvlink_tx_bytes:rate1m",
        "gpu:toposerve_gpu_nvlink_rx_bytes:rate1m",
    }
)
# Series that exist only after something failed (a labelled counter has no sample before its
# first increment). The proxy still declares them, so Prometheus must know their metadata.
FAILURE_ONLY = frozenset({("Upstream health", "B")})
# Fed only by a vLLM that offloads KV blocks to host memory (--kv-offloading-backend, LMCache:
# a KV connector); the CPU engine runs without one, so these series never exist there.
OFFLOAD_ONLY_PANELS = frozenset(
    {"KV offloading: hits from host memory", "KV offloading: bytes moved per second"}
)
OFFLOAD_METRIC_PREFIXES = ("vllm:kv_offload_", "vllm:external_prefix_cache_")
# toposerve_plan_info is set by `launcher serve`; a proxy started alone in front of a reused
# engine (TOPOSERVE_TEST_VLLM_URL, development only) has no plan to report.
LAUNCHER_ONLY_PANELS = frozenset({"Plan in force", "NCCL transport"})
