#!/usr/bin/env bash
# One configuration of the GPU table, measured through toposerve itself:
# `launcher serve` (plan forced by LAUNCHER_ARGS) + `loadgen` through the proxy.
#
#   benchmarks/gpu/run_config.sh NAME MODEL_DIR "LAUNCHER ARGS" "SCENARIOS"
#
# SCENARIOS: space-separated from single (512->256, 1 stream), long (3584-token prompt),
# c8 and c32 (512->256 at concurrency 8 / 32), proxyab (c32 direct to vLLM vs through the proxy),
# long16 (16384-token prompts, 128 generated, one and four at once), depth (512 new tokens after
# 0, 8k and 32k tokens of context, cached and cold), split (issue22_split.py: vLLM's per-request
# timers, one at a time and in bursts of 32, direct and through the proxy).
# Results: $OUT/NAME/*.json (loadgen), launcher.out, nccl.txt (the transports NCCL logged).
# Run with PYTHONPATH holding vLLM (see benchmarks/gpu/BUNDLE.md); multicast stays off.
# Weights: vLLM's dummy loader unless LOAD_FORMAT says otherwise (auto: MODEL_DIR's checkpoint,
# e.g. one benchmarks/gpu/random_checkpoint.py wrote; issue22-table.sh's WEIGHTS=random cases).
set -uo pipefail
name=$1 model=$2 largs=$3 scenarios=$4
root=${OUT:-/tmp/out}
out=$root/$name
mkdir -p "$out/logs"
port=${PORT:-8000} eport=${ENGINE_PORT:-8100}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG=INFO PYTHONUNBUFFERED=1
# Capture sizes kept short (start-up time); with TP the all-reduce+RMSNorm fusion is off and
# VLLM_ALLREDUCE_USE_SYMM_MEM=0 is exported by the caller, as benchmarks/gpu/BUNDLE.md requires.
COMPILE_CFG=${COMPILATION_CONFIG:-'{"cudagraph_capture_sizes":[1,2,4,8,16,32,64],"pass_config":{"fuse_allreduce_rms":false}}'}
# vLLM's key for this run, known here too so that the direct halves (proxyab, split) reach it
export TOPOSERVE_ENGINE_API_KEY=${TOPOSERVE_ENGINE_API_KEY:-bench-$RANDOM$RANDOM$RANDOM}
t0=$(date +%s)
# shellcheck disable=SC2086
python3 -m launcher serve --model "$model" --port "$port" --engine-port "$eport" \
  --log-dir "$out/logs" --ready-timeout 480 $largs \
  -- --load-format "${LOAD_FORMAT:-dummy}" --compilation-config "$COMPILE_CFG" ${VLLM_EXTRA:-} >"$out/launcher.out" 2>&1 &
lp=$!
ready=0
for _ in $(seq 1 500); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/ready', timeout=2)" 2>/dev/null; then
    ready=1; break
  fi
  kill -0 $lp 2>/dev/null || break
  sleep 1
done
echo "$name: ready=$ready after $(( $(date +%s) - t0 ))s" | tee -a "$root/summary.txt"
# Through the proxy unless a scenario passes its own --url (the direct half of proxyab); a failed
# loadgen is reported in summary.txt, never silently dropped.
lg() {
  python3 -m loadgen --no-progress --url "http://127.0.0.1:$port" "$@" >"$out/lg.tmp" 2>&1
  local rc=$?
  tail -n 14 "$out/lg.tmp"
  [[ $rc == 0 ]] || echo "$name: loadgen $* failed (exit $rc): $(tail -n 1 "$out/lg.tmp")" >>"$root/summary.txt"
}
# Request counts: a p50 of 3 single-stream requests moved 50% with one request (Qwen2.5-14B
# eager TTFTs 34.8/41.1/52.6 ms, session 13); 8 cost ~15 s more per model on the H200.
if [[ $ready == 1 ]]; then
  # made as the first scenario begins: with_stamps.sh's gate may open here (STAMPS_FROM)
  : >"$out/scenarios-begun"
  for s in $scenarios; do
    case $s in
      single) lg --prompt 512 --gen 256 --concurrency 1 --requests 8 --warmup 1 --json "$out/single.json" ;;
      long)   lg --prompt 3584 --gen 16 --concurrency 1 --requests 2 --warmup 1 --json "$out/long.json" ;;
      long16)
        lg --prompt 16384 --gen 128 --concurrency 1 --requests 4 --warmup 1 --json "$out/long16-c1.json"
        lg --prompt 16384 --gen 128 --concurrency 4 --requests 8 --warmup 1 --json "$out/long16-c4.json" ;;
      depth)
        lg --depth 0,8k,32k --prompt 512 --gen 64 --requests 3 --warmup 1 --json "$out/depth-cached.json"
        lg --depth 0,8k,32k --depth-cold --prompt 512 --gen 64 --requests 3 --warmup 1 --json "$out/depth-cold.json" ;;
      c8)     lg --prompt 512 --gen 256 --concurrency 8 --requests 24 --warmup 4 --json "$out/c8.json" ;;
      c32)
        # Two scrapes of the proxy's /metrics while the load runs: the GPU collector's NVLink and
        # PCIe counters should move between them.
        ( for i in 1 2; do sleep 8; echo "# scrape $i $(date +%s.%N)"
            python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$port/metrics').read().decode())" | grep -E '^toposerve_gpu_'; done ) >"$out/gpu-metrics.txt" 2>&1 &
        scraper=$!
        # loadgen's default run at 32 streams, which is what the plan simulates (loadsim's
        # LOADGEN_REQUESTS_PER_STREAM): 4 requests a stream after a warm-up of one a stream (with
        # a warm-up of 8 the first measured burst ran the engine's first 8k-token steps, and 31 of
        # its 32 first tokens came a step late: issue22_waves.py on the 2026-12-02 records). The
        # tables before the seventh measured 64 requests (2 a stream), a plan's first half.
        lg --prompt 512 --gen 256 --concurrency 32 --json "$out/c32.json"
        wait $scraper ;;  # not a bare wait: that would wait for the launcher too
      split)
        # vLLM's own per-request timers around the single and c32 requests, straight to the engine
        # and through the proxy (benchmarks/gpu/issue22_split.py)
        python3 benchmarks/gpu/issue22_split.py --engine "http://127.0.0.1:$eport" \
          --proxy "http://127.0.0.1:$port" --json "$out/split.json" ;;
      proxyab)
        for round in 1 2; do
          lg --url "http://127.0.0.1:$eport" --api-key "$TOPOSERVE_ENGINE_API_KEY" --prompt 512 --gen 256 --concurrency 32 --requests 64 --warmup 4 --json "$out/direct$round.json"
          lg --prompt 512 --gen 256 --concurrency 32 --requests 64 --warmup 4 --json "$out/proxy$round.json"
        done ;;
    esac
  done > "$out/loadgen.txt"
fi
kill -TERM $lp 2>/dev/null; wait $lp; echo "$name: launcher exit $?" >> "$root/summary.txt"
grep -ho "via [A-Za-z0-9/_]*" "$out"/logs/vllm-*.log 2>/dev/null | sort | uniq -c > "$out/nccl.txt"
grep -h -E "Retrying once|failed to start|restart" "$out/launcher.out" >> "$root/summary.txt"
# What remains of the GPU after the stop: nothing should hold memory.
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >> "$root/summary.txt"
# At most 8 files come back from one device command: one archive per configuration.
if [[ ${TAR:-1} == 1 ]]; then
  (cd "$root" && tar czf "$name.tgz" "$name" && rm -rf "$name")
fi
