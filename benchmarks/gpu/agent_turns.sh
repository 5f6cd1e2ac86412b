#!/usr/bin/env bash
# A coding agent's growing context on one H200, through toposerve itself: `launcher serve`
# (vLLM, random weights of a real shape: --load-format dummy) + the proxy, then
#   loadgen --workload agent --sessions 4 --turns 10 --context 2000:30000
# through the proxy, with vLLM's prefix-cache counters read from the engine and the proxy's GPU
# metrics sampled during the run. Prints TTFT p50 of turn 10 against turn 1 and the per-GPU lines.
#
#   OUT=/tmp/out bash benchmarks/gpu/agent_turns.sh            # from the repository root
#
# Env: MODEL (default benchmarks/gpu/models/qwen2.5-32b-shape), PORT / ENGINE_PORT (18000 /
# 18100), SESSIONS, TURNS, CONTEXT, GEN, THINK (4, 10, 2000:30000, 64, 1), MAX_MODEL_LEN (32768),
# VLLM_EXTRA (more vLLM flags). PYTHONPATH must hold vLLM (/root/site, see
# benchmarks/gpu/BUNDLE.md); it defaults to /root/site:$PWD. Results in $OUT/agent_turns/:
# agent.json (loadgen), loadgen.txt, summary.txt, launcher-tail.txt. Budget: cold start of the
# 32B shape with this capture list about 2-4 min (estimated from earlier runs, not measured with
# this script), the run about 1 min (10 turns x (1 s think + prefill/decode)).
# Checked on CPU with the embedded model (MODEL=~/.cache/toposerve/models/tiny-llama-v1
# MAX_MODEL_LEN=4096 CONTEXT=1000:3000 TURNS=3 SESSIONS=2 GEN=16 THINK=0.2 COMPILATION_CONFIG={}).
set -uo pipefail
model=${MODEL:-benchmarks/gpu/models/qwen2.5-32b-shape}
root=${OUT:-/tmp/out}
out=$root/agent_turns
mkdir -p "$out/logs"
port=${PORT:-18000} eport=${ENGINE_PORT:-18100}
export PYTHONPATH=${PYTHONPATH:-/root/site:$PWD}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# A short capture list (start-up time), as run_config.sh uses.
COMPILE_CFG=${COMPILATION_CONFIG:-'{"cudagraph_capture_sizes":[1,2,4,8,16,32,64]}'}
t0=$(date +%s)
# shellcheck disable=SC2086
python3 -m launcher serve --model "$model" --port "$port" --engine-port "$eport" \
  --log-dir "$out/logs" --ready-timeout 360 --tp 1 --pp 1 --max-model-len "${MAX_MODEL_LEN:-32768}" \
  -- --load-format dummy --compilation-config "$COMPILE_CFG" ${VLLM_EXTRA:-} \
  >"$out/launcher.out" 2>&1 &
lp=$!
ready=0
for _ in $(seq 1 380); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/ready', timeout=2)" 2>/dev/null; then
    ready=1; break
  fi
  kill -0 $lp 2>/dev/null || break
  sleep 1
done
echo "agent_turns: model $model ready=$ready after $(( $(date +%s) - t0 ))s" | tee "$out/summary.txt"
if [[ $ready == 1 ]]; then
  python3 -m loadgen --no-progress --url "http://127.0.0.1:$port" --workload agent \
    --sessions "${SESSIONS:-4}" --turns "${TURNS:-10}" --context "${CONTEXT:-2000:30000}" \
    --gen "${GEN:-64}" --think "${THINK:-1}" \
    --metrics-url "http://127.0.0.1:$eport/metrics" --gpu-sample 2 \
    --json "$out/agent.json" >"$out/loadgen.txt" 2>&1
  echo "agent_turns: loadgen exit $? after $(( $(date +%s) - t0 ))s" | tee -a "$out/summary.txt"
  cat "$out/loadgen.txt"
  # The figures the lead asked for, from the JSON (also in loadgen.txt's notes).
  python3 - "$out/agent.json" <<'PY' | tee -a "$out/summary.txt"
import json, sys
d = json.load(open(sys.argv[1]))
a = d["agent"]
turns = a["per_turn"]
def ms(x): return "-" if x is None else f"{x * 1000:.1f} ms"
for t in (turns[0], turns[-1]):
    print(f"turn {t['turn']}: prompt {t['prompt_tokens']['mean']:.0f} tok (new {t['new_tokens']['mean']:.0f}),"
          f" TTFT p50 {ms(t['ttft_s']['p50'])} p90 {ms(t['ttft_s']['p90'])},"
          f" cache hit {t['cache_hit_rate']}")
print(f"TTFT p50 turn {turns[-1]['turn']} / turn 1: {a['ttft_last_over_first_p50']}")
print(f"prefix cache over the run: {a['prefix_cache']} (source {a['cache_source']})")
for g in (d.get("gpus") or {}).get("per_gpu", []):
    print(f"GPU {g['gpu']} {g['name']}: busy mean {g['util_mean']} max {g['util_max']},"
          f" power mean {g['power_mean_w']} W max {g['power_max_w']} W ({g['samples']} samples)")
print("flagged:", (d.get("gpus") or {}).get("flagged"))
PY
fi
kill -TERM $lp 2>/dev/null; wait $lp; echo "agent_turns: launcher exit $?" >> "$out/summary.txt"
tail -n 40 "$out/launcher.out" > "$out/launcher-tail.txt"
rm -rf "$out/logs" "$out/launcher.out"  # at most 8 files come back from one device command
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >> "$out/summary.txt" 2>&1 || true
