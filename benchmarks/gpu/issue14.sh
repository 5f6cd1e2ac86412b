#!/usr/bin/env bash
# Issue 14's GPU proof on one H200: four kinds of model the cost model was not fitted to, through
# `launcher serve` + `loadgen` (run_config.sh), and the planned context started at three
# --gpu-memory-utilization values.
#
#   benchmarks/gpu/issue14.sh STEP...     (run from the repo root, PYTHONPATH holding vLLM)
#
# STEP: predict | moe | dense | sliding | awq | ctx02 | ctx05
#  predict: `launcher plan --json` of every case on this machine's NVML reading (the predictions
#           are made before the measurements, from the same tree)
#  moe/dense/sliding/awq: single (512 -> 256, 1 stream) and c32 (32 streams) at utilization 0.9;
#           the planned context is vLLM's --max-model-len (dense is the long-context Llama-3.1-8B
#           shape, so its 0.9 start is also the KV-limited context start at 0.9)
#  ctx02/ctx05: the same 8B shape started at 0.2 / 0.5 with the planned context; ready or not.
# Every step leaves $OUT/NAME.tgz and lines in $OUT/summary.txt, including vLLM's own memory
# lines (weights loaded, KV memory available, KV tokens, CUDA-graph estimate).
set -uo pipefail
M=benchmarks/gpu/models
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-}:$PWD VLLM_ALLREDUCE_USE_SYMM_MEM=0
declare -A MODEL=([moe]=qwen3-30b-a3b-shape [dense]=llama-3.1-8b-longctx-shape
  [sliding]=gemma-3-27b-shape [awq]=qwen2.5-32b-awq-shape
  [ctx02]=llama-3.1-8b-longctx-shape [ctx05]=llama-3.1-8b-longctx-shape)
declare -A UTIL=([moe]=0.9 [dense]=0.9 [sliding]=0.9 [awq]=0.9 [ctx02]=0.2 [ctx05]=0.5)
port=18200
for step in "$@"; do
  if [[ $step == predict ]]; then
    for s in moe dense sliding awq ctx02 ctx05; do
      for c in 1 32; do
        echo "== $s util ${UTIL[$s]} concurrency $c"
        python3 -m launcher plan --model "$M/${MODEL[$s]}" --tp 1 --pp 1 --dp 1 \
          --gpu-memory-utilization "${UTIL[$s]}" --concurrency $c --json 2>&1 |
          python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'max_model_len': d['max_model_len'], **d['predicted']}))"
      done
    done > "$OUT/predictions.txt" 2>&1
    continue
  fi
  scen="single c32"; [[ $step == ctx* ]] && scen=""
  port=$((port + 10))
  PORT=$port ENGINE_PORT=$((port + 100)) TAR=0 bash benchmarks/gpu/run_config.sh "$step" \
    "$M/${MODEL[$step]}" "--tp 1 --pp 1 --dp 1 --gpu-memory-utilization ${UTIL[$step]}" "$scen"
  { echo "$step: vLLM's memory lines:"
    grep -h -o -E "Model loading took.*|Available KV cache memory.*|KV cache size.*|[Gg]raph capturing finished.*|CUDA graph.*estimate.*|estimated maximum model length.*|max_num_batched_tokens=[0-9]+|max_seq_len=[0-9]+|[Ee]rror.*" \
      "$OUT/$step"/logs/vllm-*.log 2>/dev/null | sort | uniq -c | head -20
    grep -h -o -E "max-model-len [0-9]+" "$OUT/$step/launcher.out" | head -2; } >> "$OUT/summary.txt"
  (cd "$OUT" && tar czf "$step.tgz" "$step" && rm -rf "$step")
done
