#!/usr/bin/env bash
# Issue 22 on one lent H200, after the bundle's third part is unpacked into /root/site:
# the kernel tables through vLLM's own ops, then vLLM's own step time for two shapes.
set -uo pipefail
export PYTHONPATH=/root/site:$PWD VLLM_ALLREDUCE_USE_SYMM_MEM=0 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 benchmarks/gpu/kernel_table.py time --shapes benchmarks/gpu/kernel_shapes.json \
  --out "$OUT/kernel_tables_vllm.json" 2>&1 | grep -v Warning | tail -12
for m in llama-3.1-8b-longctx-shape qwen3-30b-a3b-shape; do
  timeout 240 python3 benchmarks/gpu/engine_step.py "benchmarks/gpu/models/$m" --dummy --capture 64 \
    --out "$OUT/engine_step_$m.json" > "$OUT/engine_step_$m.log" 2>&1
  tail -1 "$OUT/engine_step_$m.log"
done
