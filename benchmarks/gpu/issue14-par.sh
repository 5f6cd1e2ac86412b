#!/usr/bin/env bash
# Several engines started side by side on one GPU (their cold starts, mostly torch.compile on the
# CPU, overlap), then measured one at a time while the others sit idle (an idle vLLM engine runs
# no kernels). Each gets its own --gpu-memory-utilization share, so each start is also a start of
# the context the planner planned for that share.
#
#   benchmarks/gpu/issue14-par.sh NAME:MODEL_DIR:UTIL ...
#
# Scenarios per engine: single (512 -> 256, 1 stream, 3 requests after 1 warm-up) and c32
# (512 -> 256 at 32 streams, 64 requests after 8 warm-up), through the proxy, as run_config.sh.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-}:$PWD VLLM_ALLREDUCE_USE_SYMM_MEM=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
CFG='{"cudagraph_capture_sizes":[1,2,4,8,16,32,64]}'
declare -A PID PORT
i=0
for spec in "$@"; do
  IFS=: read -r name model util <<<"$spec"
  i=$((i + 1)); PORT[$name]=$((18300 + 10 * i))
  mkdir -p "$OUT/$name/logs"
  python3 -m launcher plan --model "$model" --tp 1 --pp 1 --dp 1 --gpu-memory-utilization "$util" \
    --concurrency 32 --json > "$OUT/$name/plan.json" 2>&1
  python3 -m launcher serve --model "$model" --port "${PORT[$name]}" --engine-port $((PORT[$name] + 100)) \
    --log-dir "$OUT/$name/logs" --ready-timeout 560 --tp 1 --pp 1 --dp 1 --gpu-memory-utilization "$util" \
    -- --load-format dummy --compilation-config "$CFG" >"$OUT/$name/launcher.out" 2>&1 &
  PID[$name]=$!
  sleep 20  # let each engine take its memory before the next one measures what is free
done
t0=$(date +%s)
for name in "${!PID[@]}"; do
  ok=0
  for _ in $(seq 1 560); do
    if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:${PORT[$name]}/ready', timeout=2)" 2>/dev/null; then ok=1; break; fi
    kill -0 "${PID[$name]}" 2>/dev/null || break
    sleep 1
  done
  echo "$name: ready=$ok ($(( $(date +%s) - t0 ))s after the last start)" | tee -a "$OUT/summary.txt"
done
for name in "${!PID[@]}"; do
  u="http://127.0.0.1:${PORT[$name]}"
  { python3 -m loadgen --no-progress --url "$u" --prompt 512 --gen 256 --concurrency 1 --requests 3 --warmup 1 --json "$OUT/$name/single.json"
    python3 -m loadgen --no-progress --url "$u" --prompt 512 --gen 256 --concurrency 32 --requests 64 --warmup 8 --json "$OUT/$name/c32.json"
  } > "$OUT/$name/loadgen.txt" 2>&1 || echo "$name: loadgen failed" >> "$OUT/summary.txt"
done
for name in "${!PID[@]}"; do kill -TERM "${PID[$name]}" 2>/dev/null; done
wait
for name in "${!PID[@]}"; do
  { echo "$name: vLLM's memory lines:"
    grep -h -o -E "Model loading took.*|Available KV cache memory.*|KV cache size.*|[Gg]raph capturing finished.*|estimated maximum model length.*|max_num_batched_tokens=[0-9]+|max_seq_len=[0-9]+|quantization=[a-z_]+" \
      "$OUT/$name"/logs/vllm-*.log 2>/dev/null | sort | uniq -c | head -20
    grep -h -E "prefill tok/s|decode tok/s|output tok/s" "$OUT/$name/loadgen.txt" | head -6; } >> "$OUT/summary.txt"
  (cd "$OUT" && tar czf "$name.tgz" "$name" && rm -rf "$name")
done
nvidia-smi --query-gpu=memory.used --format=csv,noheader >> "$OUT/summary.txt"
