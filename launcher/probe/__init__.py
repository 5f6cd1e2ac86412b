"""What the GPUs are and how they are joined: NVML readings, topology files, CUDA_VISIBLE_DEVICES,
and measured link and kernel rates.
"""
