#!/usr/bin/env bash
# Issue 24's GPU proof (and issue 22's measured kernel table) on one lent H200, through toposerve
# itself: `launcher serve` + `loadgen` through the proxy, random weights of real shapes
# (--load-format dummy). Every prediction is `launcher plan --json` on the machine, made before
# the step's measurements.
#
#   benchmarks/gpu/issue24.sh STEP...     (from the repo root, after the bundle is in /root/site)
#
# STEP:
#  smoke     vLLM imports, NVML topology, host memory (a setup mistake shows here, cheaply)
#  predict   the 8B's plans at utilisation $U: 512->256, TTFT at depth 0/8k/32k (cached and
#            recomputed), the agent turn at each depth the agent run reaches, the agent plan
#  probe     `launcher probe --measure --model 8B` (the kernel table through vLLM's ops), then
#            the same plans again, now made with that table (predict-table/)
#  depth8b   the 8B served at $U (its own plan: 16-bit KV, no offload): 512->256 single stream,
#            loadgen --depth 0,8k,32k cached and --depth-cold, then the agent workload (4
#            sessions soaked past 32k) on the GPU cache alone, which holds about one of them
#  offload8b the agent plan (4 sessions x 34k at $U) served as `launcher serve --workload agent`;
#            where the plan does not choose offloading, the same flags are given by hand
#            (--kv-offloading-backend native --kv-offloading-size GiB) and that is said
#  depth32b  the Qwen2.5-32B shape at 0.9: its plan, then depth 0,8k,32k cached and cold
#  agent09   the 8B's agent plan at 0.9 (all four sessions fit the GPU cache), served with
#            --workload agent: the same soak with one session alone, then with four, which
#            separates the cost of a turn at depth from the sessions' turns queueing together
#  soak32b   the Qwen3-32B shape (40,960 positions: room past 32k) at $U32, where the 16-bit
#            GPU cache holds about one of the four soaked sessions: its agent plan first, then
#            served plain (16-bit KV, no offload): the agent soak, 512->256 single, depth
#            0,8k,32k cached and cold, 32 streams (the later ones skipped when time is short)
#  offload32b the same shape and utilisation served with its agent plan (`--workload agent`);
#            offloading given by hand, as in offload8b, where the plan chose otherwise: the soak
# Each step leaves $OUT/STEP.tgz (at most 8 files come back from one command) and lines in
# $OUT/summary.txt. DEADLINE (epoch seconds) makes a step skip its long parts when time is short.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=/root/site:$PWD VLLM_ALLREDUCE_USE_SYMM_MEM=0 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
M8=benchmarks/gpu/models/llama-3.1-8b-longctx-shape
M32=benchmarks/gpu/models/qwen2.5-32b-shape
Q32=benchmarks/gpu/models/qwen3-32b-shape
U=${U:-0.15}
U32=${U32:-0.55}
SESS=4 SOAK=34000 TURN=4000 AGEN=64
# The 32B's turns add 8,000 tokens (5 turns to 34k): its recomputed turns take seconds each.
TURN32=8000  # the plan's --context is the prefix before the last turn: $SOAK - $TURN32
COMPILE='{"cudagraph_capture_sizes":[1,2,4,8,16,32,64]}'
DEADLINE=${DEADLINE:-$(( $(date +%s) + 560 ))}
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
left() { echo $(( DEADLINE - $(date +%s) )); }

# plan NAME ARGS...: `launcher plan --json` into $dir/NAME.json, its one-line summary beside it
plan() {
  local name=$1; shift
  timeout 120 python3 -m launcher plan --json "$@" >"$dir/$name.json" 2>"$dir/$name.err"
  python3 - "$dir/$name.json" "$name" <<'PY' >>"$dir/predictions.txt" 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
p = d["predicted"]
line = (f"{sys.argv[2]}: ttft {p['ttft_s']*1000:.1f} ms, prefill {p['prefill_tok_s']:.0f} tok/s, "
        f"decode {p['decode_tok_s']:.1f} tok/s, max_model_len {d['max_model_len']}")
a = d.get("agent")
if a:
    r = a["rooms"][0]
    line += (f"; agent choice {a['choice']} ctx {a['served_context']} offload {a['kv_offloading_gib']}"
             f" GiB; room0 {r['kv_cache_dtype']} held {r['sessions_held']}/{r['sessions_per_replica']}"
             f" ttft cached {r['ttft_cached_s']*1000:.1f} ms recomputed {r['ttft_recomputed_s']*1000:.1f} ms"
             f" copy {r['host_copy_s']*1000:.1f} ms; options "
             + "; ".join(f"{o['name']}={'yes' if o['ok'] else 'no'}"
                         + (f" {o['ttft_s']*1000:.1f} ms" if o['ttft_s'] is not None else "")
                         for o in a["options"]))
print(line)
PY
}

predict_all() {  # the 8B's predictions at $U into $dir (run in parallel: 16 cores)
  local base=(--model "$M8" --tp 1 --pp 1 --dp 1 --gpu-memory-utilization "$U")
  plan single512 "${base[@]}" --prompt 512 --gen 256 &
  timeout 120 python3 -m launcher plan "${base[@]}" --prompt 512 --gen 256 >"$dir/single512.txt" 2>&1 &
  for d in 8000 32000; do
    plan "depth$d" "${base[@]}" --workload agent --sessions 1 --context $d --prompt 512 --gen 128 &
  done
  # agent turns 2..9: 4,000 new tokens after the previous turn's prompt (2,000 + 4,000 (k-2))
  for d in 2000 6000 10000 14000 18000 22000 26000 30000; do
    plan "turn$d" "${base[@]}" --workload agent --sessions 1 --context $d --prompt $TURN --gen $AGEN &
  done
  plan agent4 "${base[@]}" --workload agent --sessions $SESS --context $SOAK --prompt $TURN --gen $AGEN &
  wait
  timeout 120 python3 -m launcher plan "${base[@]}" --workload agent --sessions $SESS \
    --context $SOAK --prompt $TURN --gen $AGEN >"$dir/agent4.txt" 2>&1
  sort -o "$dir/predictions.txt" "$dir/predictions.txt"
}

# serve NAME ARGS... [-- VLLM ARGS]: launcher serve on port 18000, ready or not within 420 s
serve() {
  local name=$1; shift
  sdir=$OUT/$name; mkdir -p "$sdir/logs"
  local t0; t0=$(date +%s)
  python3 -m launcher serve --port 18000 --engine-port 18100 --log-dir "$sdir/logs" \
    --ready-timeout 420 "$@" >"$sdir/launcher.out" 2>&1 &
  lp=$!
  ready=0
  for _ in $(seq 1 420); do
    if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:18000/ready', timeout=2)" 2>/dev/null; then
      ready=1; break
    fi
    kill -0 $lp 2>/dev/null || break
    [[ $(left) -gt 20 ]] || break
    sleep 1
  done
  say "$name: ready=$ready after $(( $(date +%s) - t0 ))s; $(grep -m1 -o 'vllm serve .*' "$sdir/launcher.out" | cut -c1-600)"
}

stop() {
  kill -TERM $lp 2>/dev/null; wait $lp; say "$1: launcher exit $?"
  { echo "== vLLM's memory and cache lines"
    grep -h -o -E "Model loading took.*|Available KV cache memory.*|GPU KV cache size.*|Maximum concurrency.*|[Gg]raph capturing finished.*|torch.compile takes.*|init engine.*took.*|[Oo]ffload[a-zA-Z]*Connector.*|kv_connector.*|(Error|ERROR).*" \
      "$sdir"/logs/vllm-*.log 2>/dev/null | cut -c1-300 | sort | uniq -c | head -40; } >>"$sdir/summary.txt"
  cat "$sdir/summary.txt" >>"$OUT/summary.txt"
  tail -n 60 "$sdir/launcher.out" >"$sdir/launcher-tail.txt"; rm -f "$sdir/launcher.out"
  for f in "$sdir"/logs/vllm-*.log; do [[ -f $f ]] && tail -n 150 "$f" >"$f.tail"; rm -f "$f"; done
  (cd "$OUT" && tar czf "$1.tgz" "$1" && rm -rf "$1")
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >>"$OUT/summary.txt" 2>&1
}

# lg FILE ARGS...: loadgen through the proxy, its text in $sdir/FILE.txt, JSON in $sdir/FILE.json
lg() {
  local f=$1; shift
  local budget=$(( $(left) - 15 ))
  if (( budget < 20 )); then say "skipped (time): loadgen $f"; return; fi
  timeout "$budget" python3 -m loadgen --no-progress --url http://127.0.0.1:18000 \
    --json "$sdir/$f.json" "$@" >"$sdir/$f.txt" 2>&1
  local rc=$?
  say "$f: loadgen exit $rc: $(grep -v '^\s*$' "$sdir/$f.txt" | tail -n 1 | cut -c1-200)"
}

metrics() {  # the engine's cache and offloading counters
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:18100/metrics').read().decode())" 2>&1 |
    grep -E "^vllm:(prefix_cache|external_prefix|kv_offload|kv_cache_usage|num_preemptions|prompt_tokens_cached|gpu_prefix|cpu_prefix)|offload" >"$sdir/$1"
}

agent_run() {
  lg "$1" --workload agent --sessions "${2:-$SESS}" --soak-tokens $SOAK --turn-tokens "${3:-$TURN}" --gen $AGEN \
    --think 1 --metrics-url http://127.0.0.1:18100/metrics --gpu-sample 2
  metrics "$1-metrics.txt"
}

# offload_soak NAME MODEL UTIL CONTEXT TURN GIB: the agent plan for $SESS sessions keeping CONTEXT
# tokens (turns of TURN new ones) at UTIL, served as `launcher serve --workload agent`, then the
# soak. Where the plan does not choose offloading (its reason is in NAME-plan/agent4.txt), the
# 16-bit cache at the same utilisation is served with GIB of host memory for KV, given by hand.
offload_soak() {
  local name=$1 model=$2 util=$3 context=$4 turn=$5 gib=$6
  dir=$OUT/$name-plan; mkdir -p "$dir"
  base=(--model "$model" --tp 1 --pp 1 --dp 1 --gpu-memory-utilization "$util")
  agent=(--workload agent --sessions $SESS --context "$context" --prompt "$turn" --gen $AGEN)
  plan agent4 "${base[@]}" "${agent[@]}"
  timeout 120 python3 -m launcher plan "${base[@]}" "${agent[@]}" >"$dir/agent4.txt" 2>&1
  choice=$(python3 -c "import json; print(json.load(open('$dir/agent4.json'))['agent']['choice'])")
  say "$name: the agent plan chose '$choice'"; cat "$dir/predictions.txt" >>"$OUT/summary.txt"
  (cd "$OUT" && tar czf "$name-plan.tgz" "$name-plan" && rm -rf "$name-plan")
  if [[ $choice == offload ]]; then
    serve "$name" "${base[@]}" "${agent[@]}" -- --load-format dummy --compilation-config "$COMPILE"
  else
    say "$name: offloading given by hand (--kv-offloading-size $gib)"
    serve "$name" "${base[@]}" -- --load-format dummy --compilation-config "$COMPILE" \
      --kv-offloading-backend native --kv-offloading-size "$gib"
  fi
  if [[ $ready == 1 ]]; then agent_run agent-offload $SESS "$turn"; fi
  stop "$name"
}

for step in "$@"; do
  say "== $step at $(date -u +%FT%TZ), $(left) s before the deadline"
  case $step in
    smoke)
      { python3 -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__, torch.cuda.get_device_name(0))'
        timeout 60 python3 -m launcher probe; grep -E "MemTotal|MemAvailable" /proc/meminfo; nproc
        nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,pcie.link.gen.current,pcie.link.width.current --format=csv
      } >"$OUT/smoke.txt" 2>&1
      tail -n 30 "$OUT/smoke.txt"
      # no vLLM: nothing after this can run
      grep -q "^vllm " "$OUT/smoke.txt" || { say "smoke: vLLM does not import; stopping"; exit 1; } ;;
    predict)
      dir=$OUT/predict; mkdir -p "$dir"; predict_all; cat "$dir/predictions.txt" | tee -a "$OUT/summary.txt"
      grep -E "option|agent plan" "$dir/agent4.txt" | tee -a "$OUT/summary.txt"
      (cd "$OUT" && tar czf predict.tgz predict && rm -rf predict) ;;
    probe)
      dir=$OUT/probe; mkdir -p "$dir"
      t0=$(date +%s)
      timeout 180 python3 -m launcher probe --measure --model "$M8" >"$dir/probe-measure.txt" 2>&1
      say "probe --measure --model: exit $? after $(( $(date +%s) - t0 ))s"; tail -n 8 "$dir/probe-measure.txt" | tee -a "$OUT/summary.txt"
      cp -r /root/.cache/toposerve/kernels "$dir/kernel-cache" 2>/dev/null
      predict_all; cat "$dir/predictions.txt" | tee -a "$OUT/summary.txt"
      grep -i -E "kernel|table|roofline|measured" "$dir/single512.txt" | head -8 | tee -a "$OUT/summary.txt"
      (cd "$OUT" && tar czf probe.tgz probe && rm -rf probe) ;;
    depth8b)
      serve depth8b --model "$M8" --tp 1 --pp 1 --dp 1 --gpu-memory-utilization "$U" \
        -- --load-format dummy --compilation-config "$COMPILE"
      if [[ $ready == 1 ]]; then
        lg single --prompt 512 --gen 256 --concurrency 1 --requests 4 --warmup 2
        lg depth-cached --depth 0,8k,32k --prompt 512 --gen 128 --requests 5 --warmup 1
        lg depth-cold --depth 0,8k,32k --depth-cold --prompt 512 --gen 128 --requests 5 --warmup 1
        metrics before-agent-metrics.txt
        agent_run agent-gpu-only
      fi
      stop depth8b ;;
    offload8b)
      # 19 GiB by hand if the plan chooses otherwise: 4 x 34k tokens x 128 KiB, +10%
      offload_soak offload8b "$M8" "$U" "$SOAK" "$TURN" 19 ;;
    depth32b)
      dir=$OUT/predict32b; mkdir -p "$dir"
      base=(--model "$M32" --tp 1 --pp 1 --dp 1 --gpu-memory-utilization 0.9)
      plan single512 "${base[@]}" --prompt 512 --gen 256 &
      for d in 8000 32000; do
        plan "depth$d" "${base[@]}" --workload agent --sessions 1 --context $d --prompt 512 --gen 128 &
      done
      wait; cat "$dir/predictions.txt" | tee -a "$OUT/summary.txt"
      (cd "$OUT" && tar czf predict32b.tgz predict32b && rm -rf predict32b)
      serve depth32b "${base[@]}" -- --load-format dummy --compilation-config "$COMPILE"
      if [[ $ready == 1 ]]; then
        lg single --prompt 512 --gen 128 --concurrency 1 --requests 3 --warmup 1
        lg depth-cached --depth 0,8k,32k --prompt 512 --gen 64 --requests 3 --warmup 1
        lg depth-cold --depth 0,8k,32k --depth-cold --prompt 512 --gen 64 --requests 3 --warmup 1
      fi
      stop depth32b ;;
    agent09)
      dir=$OUT/agent09-plan; mkdir -p "$dir"
      base=(--model "$M8" --tp 1 --pp 1 --dp 1 --gpu-memory-utilization 0.9)
      agent=(--workload agent --sessions $SESS --context $SOAK --prompt $TURN --gen $AGEN)
      plan agent4 "${base[@]}" "${agent[@]}"
      timeout 120 python3 -m launcher plan "${base[@]}" "${agent[@]}" >"$dir/agent4.txt" 2>&1
      cat "$dir/predictions.txt" >>"$OUT/summary.txt"
      (cd "$OUT" && tar czf agent09-plan.tgz agent09-plan && rm -rf agent09-plan)
      serve agent09 "${base[@]}" "${agent[@]}" -- --load-format dummy --compilation-config "$COMPILE"
      if [[ $ready == 1 ]]; then
        agent_run agent-lone 1
        agent_run agent-4 4
      fi
      stop agent09 ;;
    soak32b)
      dir=$OUT/soak32b-plan; mkdir -p "$dir"
      base=(--model "$Q32" --tp 1 --pp 1 --dp 1 --gpu-memory-utilization "$U32")
      agent=(--workload agent --sessions $SESS --context $((SOAK - TURN32)) --prompt $TURN32 --gen $AGEN)
      plan agent4 "${base[@]}" "${agent[@]}" &
      plan single512 "${base[@]}" --prompt 512 --gen 256 &
      plan c32 "${base[@]}" --prompt 512 --gen 256 --concurrency 32 &
      for d in 8000 32000; do
        plan "depth$d" "${base[@]}" --workload agent --sessions 1 --context $d --prompt 512 --gen 64 &
      done
      wait
      timeout 120 python3 -m launcher plan "${base[@]}" "${agent[@]}" >"$dir/agent4.txt" 2>&1
      sort -o "$dir/predictions.txt" "$dir/predictions.txt"
      cat "$dir/predictions.txt" >>"$OUT/summary.txt"
      grep -E "option|agent plan|TTFT p50 by depth" "$dir/agent4.txt" | tee -a "$OUT/summary.txt"
      (cd "$OUT" && tar czf soak32b-plan.tgz soak32b-plan && rm -rf soak32b-plan)
      serve soak32b "${base[@]}" -- --load-format dummy --compilation-config "$COMPILE"
      if [[ $ready == 1 ]]; then
        lg single --prompt 512 --gen 256 --concurrency 1 --requests 3 --warmup 1
        agent_run agent-gpu-only $SESS $TURN32
        lg depth-cached --depth 0,8k,32k --prompt 512 --gen 64 --requests 3 --warmup 1
        lg depth-cold --depth 0,8k,32k --depth-cold --prompt 512 --gen 64 --requests 3 --warmup 1
        lg c32 --prompt 512 --gen 256 --concurrency 32 --requests 64 --warmup 8
      fi
      stop soak32b ;;
    offload32b)
      # 41 GiB by hand: 4 x 38k tokens x 256 KiB (16-bit KV of 64 layers x 8 heads x 128), +10%
      offload_soak offload32b "$Q32" "$U32" $((SOAK - TURN32)) "$TURN32" 41 ;;
  esac
done
say "done at $(date -u +%FT%TZ)"
