#!/usr/bin/env bash
# Issue 22's proof table on one lent H200: shapes the cost model was not fitted to, each started
# once through `launcher serve` and measured with `loadgen` through the proxy (run_config.sh),
# every figure predicted by `launcher plan --json` on the same machine before any measurement.
#
#   benchmarks/gpu/issue22-table.sh STEP...   (repo root, after the bundle is in /root/site)
#
# STEP: predict | retime | moonlightd | gemma12d | mladef | qwen06 | gemma270 | q3awq32 | moe30
#       | phi4 | qwen15 | qwen17 | gemma1b | granite8 | q3awq14 | llama2
#       | awq70 | qwen8b | gemma4b | qwen3b | mlalong
#       | glm | gemma12 | awq8b | qwen4b | qwen14 | small24
#       | moonlight | smollm2 | awq14 | gemma2 | long14 | nemo12
#       | small | qwen7b | mla | awq | gemma | long8b | qwen3 | small3b
#  predict  plans of every case below (or of $PREDICT_CASES) for each of its scenarios
#           -> $OUT/predictions.jsonl ($OUT/predictions-$PRED_TAG.jsonl with PRED_TAG set); each
#           line says whether the plan's speed came from a kernel table kept on the machine
#  probe    `launcher probe --measure` (this host's front end, the GPU's GEMM rates), then
#           `launcher probe --measure --model` of every case in $PREDICT_CASES (its kernel table,
#           kept where plans find it) -> $OUT/probe.txt, the tables in $OUT/kernels.tgz and the
#           host timing record in $OUT/host-cost-CASES.json. The order that shows both paths, each
#           before anything is served: PRED_TAG=roofline predict, probe, PRED_TAG=tables predict
#  profile  each of $PROFILE_CASES' prompt steps profiled on the device (prompt_profile.py: kernels
#           by name, the span, the gaps), 512 tokens and, with long16, 16k -> $OUT/profile-*.jsonl
#  retime   this host's front end timed again (the host-only part of `probe --measure`, kept
#           where plans find it, as the probe keeps it), appended to $OUT/host-timings.txt:
#           run right before a case's plans, so that they describe the host as it is then
# Weights: vLLM's dummy loader (--load-format dummy) for every case but the 4-bit (AWQ) ones, which
# WEIGHTS below marks random: such a step first writes a random checkpoint of the shape with
# benchmarks/gpu/random_checkpoint.py (--device cuda, to $CKPT_ROOT/<shape folder>, default
# /root/ckpt; the served model keeps the shape folder's name), serves it with --load-format auto
# (run_config.sh's LOAD_FORMAT) and deletes it after the case (KEEP_CKPT=1 keeps it; awq70's is
# 33.2 GiB of the machine's 64 GiB disk). Why: the dummy loader leaves a 4-bit layer's integer
# weights (qweight, qzeros) as zeros, on which the H200's 4-bit GEMM runs x0.82-0.83 of the
# random weights' time at 8192 tokens and x0.85-0.91 at 512 (results/2026-12-04-h200-table9/
# dummy-weights.txt); the plans describe a real checkpoint. Every 4-bit figure of the tables up
# to the ninth was measured on the zeros; LOAD_WEIGHTS=dummy serves every case that way again.
# The plans (predict, probe) read the shape folder as before: the checkpoint's size is the size
# the plans take for it, to the byte (launcher.model.modelspec's AWQ estimate).
# Beside every step, benchmarks/gpu/host_speed.py samples the host's speed (a fixed piece of
# pure-Python work, CPU and wall time, and the machine's steal time) every second (5 s before
# session 29) into
# $OUT/host-speed.jsonl: whether the host's speed moves between the probe and the serving.
# MONITOR_BUSY=S adds, after every MONITOR_BUSY_EVERY-th sample, S seconds of the same work
# back to back (a thread that never sleeps, as an engine core's): whether such a thread sees the host's slow level as the
# sleeping sampler does (the eighth table's engines did not follow the sampler: its README)
# The twelfth table (2026-12-04, session 24), at vLLM's DEFAULT CUDA-graph range (RANGE '{}'):
#  moonlightd  Moonlight-16B-A3B shape (DeepSeek-V3 layout: latent attention, 64 experts top 6 +
#              2 shared, grouped sigmoid router) with the router drawn uniformly at random as
#              glm's: single, c32 (0.3). The moonlight case (table 3) ran with graphs to 64 and
#              the dummy router.
#  gemma12d    Gemma-3-12B shape (sliding window on 5 of 6 layers): single, c32, long16 (0.4).
#              The gemma12 case (table 4) ran with graphs to 64.
#  with phi4 (never served), qwen8b (shared with aiconfigurator) and q3awq14 (4-bit, a random
#  checkpoint) below.
# The eleventh table (2026-12-04, session 23):
#  mladef   DeepSeek-V2-Lite shape (latent attention, 64 experts top 6 + 2 shared, softmax router)
#           at vLLM's DEFAULT CUDA-graph range (RANGE '{}'), the router drawn uniformly at random
#           as glm's: single, c32 (0.5). The mla case's runs (tables 1-2) were at graphs to 64
#           with the dummy router; this checks the MLA prefill host work within piecewise graphs
#           (families.MLA_PREFILL_HOST_S, fitted to GLM only) on a second latent-attention family
# Fresh shapes for the eighth table (2026-12-03, session 19), never served before (moe30's shape
# once, otherwise), at vLLM's DEFAULT CUDA-graph range (RANGE '{}'); each folder's SOURCE.md says
# where its config came from and what was changed (the 4,096-token vocabulary, bos/eos 0/1):
#  qwen06   Qwen3-0.6B shape (the smallest dense: 28 layers of 1024, 16 heads of 128 over it,
#           8 KV heads, tied embeddings, 40,960 positions; aiconfigurator 0.12 estimates it):
#           single, c32, long16 (0.3: the plan's KV holds 378k tokens, 4 x 16.5k = 66k)
#  gemma270 Gemma-3-270M shape (Gemma3ForCausalLM text-only: 18 layers of 640, sliding window 512
#           on 15, one KV head of 256; aiconfigurator refuses Gemma3): single, c32 (0.3)
#  q3awq32  Qwen3-32B AWQ INT4 shape (4-bit, group 128, 15.2 GiB here, ~19 GB with the real
#           vocabulary; at 32 streams, the 4-bit figure the issue names; aiconfigurator refuses
#           awq): single, c32 (0.3: KV 24.8 GiB = 102k tokens, c32 of 768 takes 25k)
#  moe30    Qwen3-30B-A3B shape (Qwen3 MoE: 128 experts top 8, no shared expert, 48 layers,
#           55.7 GiB bf16; aiconfigurator estimates it): single, c32, long16 (0.5: KV 12.9 GiB =
#           141k tokens for 4 x 16.5k = 66k; 40,960 positions). Served once before, by issue 14
#           (2026-12-01: single and c32 at 0.44, graphs to 64, the dummy router): here at the
#           default range, with 16k prompts, and the router drawn uniformly at random as glm's and
#           mlalong's (dummy weights send a batch to a few experts; the plan assumes a trained
#           router's spread)
# Time on the H200 (the seventh table's records: small shapes ready after 125-142 s, the first
# start of a machine ~90 s more and its first compile ~230 s; issue 14's moe ready after 176 s):
# qwen06 ~230 (cold) + 40 (long16 at 0.6B: seconds), gemma270 ~130 + 20, q3awq32 ~150 + 35
# (4-bit decode ~87 tok/s planned), moe30 ~200 + 50 (56 GiB of dummy weights, 16k prompts);
# with the teardowns ~900 s in all. Order:
#   1. PREDICT_CASES="qwen06 gemma270 q3awq32 moe30" bash benchmarks/gpu/issue22-table.sh \
#        predict qwen06 gemma270                                  (~30 s of plans, ~450 s)
#   2. bash benchmarks/gpu/issue22-table.sh q3awq32 moe30         (~450 s)
# Fresh shapes for the seventh table (2026-12-03, session 18), never served before; the sixth
# table's gemma1b and llama2 (planned there, never served) with them:
#  phi4     Phi-4 shape (the Phi-3 family, never served: 40 layers of 5120, 10 KV heads, 16,384
#           positions): single, c32 (0.4)
#  qwen15   Qwen2.5-1.5B shape (small dense, 28 layers of 1536, 2 KV heads, tied; aiconfigurator
#           estimates it): single, c32, long16 (0.3)
# Fresh shapes for the sixth table (2026-12-03, session 17), never served before, at vLLM's
# DEFAULT CUDA-graph range (RANGE '{}', as the fifth's); each folder's SOURCE.md says where its
# config came from and what was changed (the 4,096-token vocabulary, bos/eos 0/1):
#  qwen17   Qwen3-1.7B shape (small dense, 28 layers of 2048, 8 KV heads, tied embeddings; the
#           config aiconfigurator 0.12 ships, and it estimates it): single, c32 (0.3)
#  gemma1b  Gemma-3-1B shape (sliding window 512 on 22 of 26 layers, one KV head of 256): single,
#           c32, long16 (0.3: a 16k prompt attends over 512 tokens in all but 4 layers)
#  granite8 Granite-3.3-8B-Instruct shape (a family never measured: GraniteForCausalLM, Llama's
#           layer with muP multipliers, 40 layers of 4096, 12800 MLP, tied embeddings): single,
#           c32, long16 (0.4: KV for 4 x 16.5k with room; 131,072 positions)
#  q3awq14  Qwen3-14B AWQ INT4 shape (4-bit, group 128, at 32 streams; the bf16 Qwen3-14B shape
#           of the fourth table is the same network): single, c32 (0.3)
#  llama2   Llama-2-7B shape (no GQA: 32 KV heads, 512 KiB of KV a token; aiconfigurator
#           estimates it): single, c32 (0.3; 4,096 positions)
# No unserved latent-attention MoE again: no published config.json of one that fits one H200
# was found (GigaChat3-10B-A1.8B's pages were readable, its config.json was not).
# Time on the H200 (the fifth table's records: ready after 142-210 s at the default range, the
# first start of a machine ~60 s more; its scenarios 20-45 s; ~15 s between cases):
# qwen17 ~210 (cold) + 15, gemma1b ~140 + 35, granite8 ~150 + 45 (16k at 8B), q3awq14 ~165 + 25,
# llama2 ~145 + 20; with the teardowns ~1,000 s in all, ~850 s without llama2 (the one to drop
# if less is left: an extra shared-with-aiconfigurator case, no category of its own). Order:
#   1. PREDICT_CASES="qwen17 gemma1b granite8 q3awq14 llama2" bash benchmarks/gpu/issue22-table.sh \
#        predict qwen17 gemma1b                                   (~30 s of plans, ~430 s)
#      (with the fifth's PRED_TAG=shipped predict / probe --measure / PRED_TAG=measured predict
#      sequence instead of the plain predict: ~100 s, ~500 s in all)
#   2. bash benchmarks/gpu/issue22-table.sh granite8 q3awq14      (~400 s)
#   3. bash benchmarks/gpu/issue22-table.sh llama2                (~180 s)
# Fresh shapes for the fifth table (2026-12-03, session 16), never served before, at vLLM's DEFAULT
# CUDA-graph range: each case below carries COMPILATION_CONFIG='{}' (RANGE), in its plans and its
# start alike, unless COMPILATION_CONFIG is set for the whole run. Each folder's SOURCE.md says
# where its config came from.
#  awq70    Llama-3.3-70B-Instruct AWQ INT4 shape (4-bit, group 128; 33.2 GiB): single, c32,
#           long16 (0.5: the plan's KV holds 110k tokens, 4 x 16.5k = 66k with room)
#  qwen8b   Qwen3-8B shape (dense, 36 layers; aiconfigurator 0.12 estimates it): single, c32,
#           depth (0.3)
#  gemma4b  Gemma-3-4B shape (text only; 29 of 34 layers sliding over 1,024): single, c32,
#           long16 (0.3)
#  qwen3b   Qwen2.5-3B shape (small dense, 2 KV heads, tied embeddings): single, c32 (0.3)
#  mlalong  GLM-4.7-Flash shape (latent attention, 64 experts top 4 + 1 shared) under a WORKLOAD
#           never measured: 16k prompts one and four at once (the fourth table measured single
#           and c32 only, at graphs to 64; both again here at the default range, where decode is a
#           seen figure); the router drawn uniformly at random as glm's (0.6, as glm). The
#           DeepSeek-V2-Lite shape cannot take 16k prompts (its config keeps 8,192 positions)
# No unserved latent-attention MoE: no published config.json of one (GigaChat3-10B-A1.8B,
# Kanana-2-30B-A3B) could be found to copy from, hence the new workload on a served shape.
# Time on the H200 (ready-after from the earlier summary.txt files, plus each scenario's share
# of the gap between the fourth table's starts): awq70 ~200-240 s ready + ~150-180 s of
# scenarios (70B decode at ~43 tok/s, 16k prompts 1 and 4 at once) = ~400 s, a call of its own;
# qwen8b ~125 + ~80 s (depth) and gemma4b ~130 + ~55 s (long16) = ~400 s together; qwen3b
# ~80 + ~25 s. Order, one 600 s call each (after predict, ~30 s, in the first):
#   1. PREDICT_CASES="awq70 qwen8b gemma4b qwen3b" bash benchmarks/gpu/issue22-table.sh predict
#      then bash benchmarks/gpu/issue22-table.sh qwen3b          (~140 s with the plans)
#   2. bash benchmarks/gpu/issue22-table.sh awq70                 (~400 s)
#   3. bash benchmarks/gpu/issue22-table.sh qwen8b gemma4b        (~400 s)
# Fresh shapes for the fourth table (2026-12-03, session 15), never served before, planned by the
# code sent with them before any of them started:
#  glm      GLM-4.7-Flash shape (latent attention, 64 experts top 4 + 1 shared): single, c32 (0.6),
#           the router's choice uniform at random (vLLM's VLLM_MOE_ROUTING_SIMULATION_STRATEGY):
#           dummy weights route a batch to a few experts, a trained router spreads it
#  gemma12  Gemma-3-12B shape (sliding window on 5 of 6 layers): single, c32, long16 (0.4)
#  awq8b    Llama-3.1-8B AWQ INT4 shape: single, c32 (0.3)
#  qwen4b   Qwen3-4B shape (small dense): single, c32, depth (0.3)
#  qwen14   Qwen3-14B shape: long16, single, c32, depth (0.4); aiconfigurator estimates it
#  small24  Mistral-Small-24B shape: long16, single, c32, depth (0.5) (if time allows: the
#           Mistral family; aiconfigurator refuses MistralForCausalLM)
# The third table's shapes (2026-12-02, session 12/13), the issue's categories first; each
# folder's SOURCE.md says where its config came from and what was changed (the 4,096-token
# vocabulary and ids 0/1 for bos/eos, so sampled ids stay inside the small tokenizer):
#  moonlight  Moonlight-16B-A3B shape (DeepseekV3: latent attention, 64 experts top 6, sigmoid
#             routing): single, c32 (0.3)
#  smollm2    SmolLM2-1.7B shape (Llama, 32 KV heads of 64: no GQA): single, c32 (0.3)
#  awq14      Qwen2.5-14B-Instruct-AWQ shape (4-bit, group 128): single, c32 (0.3)
#  gemma2     Gemma-2-9B shape (21 of 42 layers sliding over 4,096 tokens, soft-capping):
#             single, c32 (0.3)
#  long14     Qwen2.5-14B shape (bf16): 16k-token prompts one and four at once, then single,
#             c32 (0.4: 4 x 16.5k tokens of KV with room)
#  nemo12     Mistral-Nemo-12B shape (head_dim 128 under hidden 5120): long16, single, c32 (0.4)
# Measured in earlier sessions (later cost-model work has seen their results):
#  small    Llama-3.2-1B shape (real 128k vocabulary): single, c32
#  qwen7b   Qwen2.5-7B shape (real 152k vocabulary): single, c32
#  mla      DeepSeek-V2-Lite shape (latent attention, 64 experts): single, c32
#  awq      Qwen2.5-32B AWQ shape (4-bit weights): single, c32
#  gemma    Gemma-3-27B shape (sliding window on 5 of 6 layers): single, c32, long16, depth
#  long8b   Llama-3.1-8B shape: 16k-token prompts, one and four at once
#  qwen3    Qwen3-32B shape (q/k norms, 64 heads): single, c32, long16, depth
#  small3b  Llama-3.2-3B shape: single, c32, long16, depth
# One GPU, --gpu-memory-utilization per case (UTIL below), random weights (--load-format dummy;
# the 4-bit cases a random checkpoint: WEIGHTS below).
# CUDA graphs to 64 tokens for the cases before the fifth table (run_config.sh's default; RANGE
# below gives each case its range, passed to the plans and to run_config.sh alike, and
# COMPILATION_CONFIG set in the environment overrides every case's);
# vLLM's own default range (to 512 tokens, so a 512-token prompt replays piecewise graphs) is
# COMPILATION_CONFIG='{}', e.g. `COMPILATION_CONFIG='{}' PRED_TAG=default NAME_SUFFIX=-default
# PREDICT_CASES=smollm2 bash benchmarks/gpu/issue22-table.sh predict smollm2`: the roofline
# takes every prefill step as eager, which no run with the default range has checked yet.
set -uo pipefail
M=benchmarks/gpu/models
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-/root/site}:$PWD VLLM_ALLREDUCE_USE_SYMM_MEM=0 PYTHONUNBUFFERED=1
declare -A MODEL=([moonlightd]=moonlight-16b-a3b-shape [gemma12d]=gemma-3-12b-shape
  [mladef]=deepseek-v2-lite-shape [qwen06]=qwen3-0.6b-shape [gemma270]=gemma-3-270m-shape
  [q3awq32]=qwen3-32b-awq-shape [moe30]=qwen3-30b-a3b-shape
  [phi4]=phi-4-shape [qwen15]=qwen2.5-1.5b-shape [qwen17]=qwen3-1.7b-shape [gemma1b]=gemma-3-1b-shape
  [granite8]=granite-3.3-8b-shape [q3awq14]=qwen3-14b-awq-shape [llama2]=llama-2-7b-shape
  [mlalong]=glm-4.7-flash-shape [awq70]=llama-3.3-70b-awq-shape [qwen8b]=qwen3-8b-shape
  [gemma4b]=gemma-3-4b-shape [qwen3b]=qwen2.5-3b-shape
  [glm]=glm-4.7-flash-shape [gemma12]=gemma-3-12b-shape
  [awq8b]=llama-3.1-8b-awq-shape [qwen4b]=qwen3-4b-shape [small24]=mistral-small-24b-shape [qwen14]=qwen3-14b-shape
  [moonlight]=moonlight-16b-a3b-shape [smollm2]=smollm2-1.7b-shape
  [awq14]=qwen2.5-14b-awq-shape [gemma2]=gemma-2-9b-shape [long14]=qwen2.5-14b-shape
  [nemo12]=mistral-nemo-12b-shape
  [small]=llama-3.2-1b-shape [qwen7b]=qwen2.5-7b-shape
  [mla]=deepseek-v2-lite-shape [awq]=qwen2.5-32b-awq-shape [gemma]=gemma-3-27b-shape
  [long8b]=llama-3.1-8b-longctx-shape [qwen3]=qwen3-32b-shape [small3b]=llama-3.2-3b-shape)
declare -A SCEN=([moonlightd]="single c32" [gemma12d]="single c32 long16"
  [mladef]="single c32" [qwen06]="single c32 long16" [gemma270]="single c32" [q3awq32]="single c32"
  [moe30]="single c32 long16"
  [phi4]="single c32" [qwen15]="single c32 long16" [qwen17]="single c32" [gemma1b]="single c32 long16"
  [granite8]="single c32 long16" [q3awq14]="single c32" [llama2]="single c32"
  [mlalong]="long16 single c32" [awq70]="single c32 long16" [qwen8b]="single c32 depth"
  [gemma4b]="single c32 long16" [qwen3b]="single c32"
  [glm]="single c32" [gemma12]="single c32 long16" [awq8b]="single c32"
  [qwen4b]="single c32 depth" [small24]="long16 single c32 depth" [qwen14]="long16 single c32 depth"
  [moonlight]="single c32" [smollm2]="single c32" [awq14]="single c32"
  [gemma2]="single c32" [long14]="long16 single c32" [nemo12]="long16 single c32"
  [small]="single c32" [qwen7b]="single c32" [mla]="single c32"
  [awq]="single c32" [gemma]="single c32 long16 depth" [long8b]="long16"
  [qwen3]="single c32 long16 depth" [small3b]="single c32 long16 depth")
# The 8B's long prompts need 4 x 16.5k tokens of KV: 0.3 holds ~300k and starts far sooner than
# 0.9 (912k tokens, 219 s to ready on 2026-12-01).
# The fresh shapes at 0.3 (0.4 with 16k prompts): every scenario fits with room, and the starts
# stay short (a 0.9 pool for a small or latent-attention KV runs to millions of tokens).
declare -A UTIL=([moonlightd]=0.3 [gemma12d]=0.4 [mladef]=0.5 [qwen06]=0.3 [gemma270]=0.3 [q3awq32]=0.3 [moe30]=0.5
  [phi4]=0.4 [qwen15]=0.3 [qwen17]=0.3 [gemma1b]=0.3 [granite8]=0.4 [q3awq14]=0.3 [llama2]=0.3
  [mlalong]=0.6 [awq70]=0.5 [qwen8b]=0.3 [gemma4b]=0.3 [qwen3b]=0.3
  [glm]=0.6 [gemma12]=0.4 [awq8b]=0.3 [qwen4b]=0.3 [small24]=0.5 [qwen14]=0.4
  [moonlight]=0.3 [smollm2]=0.3 [awq14]=0.3 [gemma2]=0.3 [long14]=0.4 [nemo12]=0.4
  [small]=0.9 [qwen7b]=0.9 [mla]=0.9 [awq]=0.9 [gemma]=0.9 [long8b]=0.3
  [qwen3]=0.9 [small3b]=0.3)
# The fractions above are of an H200's 143,771 MiB (nvidia-smi's memory.total), where every case
# was sized. On a card of another size (a lent H100: 81,559 MiB) the same bytes are asked for,
# capped at 0.92, so a case keeps its weights' room and its KV pool and its plans and its start
# read the same scaled figure (base() below); at 0.5 of an H200 moe30 asks 0.88 of an H100.
UTIL_REF_MIB=${UTIL_REF_MIB:-143771}
if gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n1) \
    && [[ $gpu_mib =~ ^[0-9]+$ ]] && (( gpu_mib != UTIL_REF_MIB )); then
  for k in "${!UTIL[@]}"; do
    UTIL[$k]=$(awk -v u="${UTIL[$k]}" -v r="$UTIL_REF_MIB" -v t="$gpu_mib" \
      'BEGIN { v = u * r / t; if (v > 0.92) v = 0.92; printf "%.2f", v }')
  done
  echo "GPU memory ${gpu_mib} MiB: each case's utilisation scaled from the H200's ${UTIL_REF_MIB} MiB" >&2
fi
# each case's weights: dummy (vLLM's dummy loader) unless named here; random: a random checkpoint
# written on the machine before the start (see the header). LOAD_WEIGHTS=dummy|random overrides all
declare -A WEIGHTS=([q3awq32]=random [q3awq14]=random [awq70]=random [awq8b]=random
  [awq14]=random [awq]=random)
# as run_config.sh sets it (keep the two in step): graphs to 64 tokens
GRAPHS64='{"cudagraph_capture_sizes":[1,2,4,8,16,32,64],"pass_config":{"fuse_allreduce_rms":false}}'
# each case's CUDA-graph range, the same in its plans and its start: the fifth to eighth
# tables' cases at vLLM's default ('{}'), every earlier case as it was measured (to 64 tokens)
declare -A RANGE=([moonlightd]='{}' [gemma12d]='{}' [mladef]='{}' [qwen06]='{}' [gemma270]='{}' [q3awq32]='{}' [moe30]='{}'
  [phi4]='{}' [qwen15]='{}' [qwen17]='{}' [gemma1b]='{}' [granite8]='{}' [q3awq14]='{}' [llama2]='{}'
  [mlalong]='{}' [awq70]='{}' [qwen8b]='{}' [gemma4b]='{}' [qwen3b]='{}')
compile_cfg() { echo "${COMPILATION_CONFIG:-${RANGE[$1]:-$GRAPHS64}}"; }
base() { echo "--tp 1 --pp 1 --dp 1 --gpu-memory-utilization ${UTIL[$1]}"; }
# the MoE routing the plans assume for a case (see glm above): uniform at random, or vLLM's own
routing_of() { case $1 in glm|mlalong|moe30|mladef|moonlightd) echo uniform_random ;; esac; }

# predict CASE SCENARIO ARGS...: one JSON line with the plan's figures for that workload
predict() {
  local case=$1 scen=$2; shift 2
  # shellcheck disable=SC2046
  # the engine flags run_config.sh starts vLLM with (its CUDA-graph range among them), so that
  # the plan predicts the server that is measured
  local cfg; cfg=$(compile_cfg "$case")
  timeout 120 python3 -m launcher plan --json --model "$M/${MODEL[$case]}" $(base "$case") "$@" \
    -- --load-format dummy --compilation-config "$cfg" 2>&1 |
    CFG=$cfg python3 -c "
import json, os, sys
raw = sys.stdin.read()
try:
    d = json.loads(raw)
except ValueError:
    sys.stdout.write(json.dumps({'case': '$case', 'scenario': '$scen', 'error': raw.strip()[-300:]}) + '\\n')
    sys.exit()
out = {'case': '$case', 'scenario': '$scen', 'max_model_len': d['max_model_len'], **d['predicted'],
       'kernel_table': any('kernel table' in r for r in d.get('reasons', [])),
       'compilation_config': os.environ['CFG']}
if d.get('agent'):
    out['agent_rooms'] = d['agent']['rooms']
# one write a line: the plans run side by side into one file, and print's two writes (the line,
# then its newline, where stdout is unbuffered) interleaved two plans' lines in the thirteenth table
sys.stdout.write(json.dumps(out) + '\\n')"
}

port=18500
# the host's speed sampled beside every step (see above); stopped when this script ends
# (from a subshell, so that it is no job of this shell's: predict's bare `wait` would wait for it)
# MONITOR_SWEEP=1 (issue22-case.sh's default; only where a step serves a case): the host's pace
# by duty cycle and by CPU (host_speed.py --duty/--per-cpu, its docstring) swept once before the
# first engine starts (a row tagged "before", ~15 s here, nothing else running) and once (by duty
# only) as each engine serves (the sampler's first row after run_config.sh's "ready=1" line in
# summary.txt, which falls in the case's first scenario); rows keep every older field. Read:
# host_speed_read.py
sweep=()
if [[ ${MONITOR_SWEEP:-0} == 1 ]]; then
  for s_ in "$@"; do [[ -n ${MODEL[$s_]:-} ]] && sweep=(--duty "${SWEEP_DUTY:-10,25,50,75,100}"
    --duty-seconds "${SWEEP_SECONDS:-2}" --burst-ms "${SWEEP_BURST_MS:-3}" --per-cpu "${SWEEP_CPU_S:-0.2}"); done
  ((${#sweep[@]})) && timeout 60 python3 benchmarks/gpu/host_speed.py --samples 1 --busy "${MONITOR_BUSY:-0}" \
    "${sweep[@]}" --sweep-at-start --tag before >>"$OUT/host-speed.jsonl" 2>/dev/null
  # while serving only with MONITOR_SERVING_SWEEP=1 (by duty): table 16's ran through the whole
  # single-stream scenario and kept its rows from recording the engine's threads (host-threads-t16.md);
  # the pinned timing on the engine's own CPUs (below) reads the host beside its steps instead
  if [[ ${MONITOR_SERVING_SWEEP:-0} == 1 ]]; then
    ((${#sweep[@]})) && sweep=(--duty "${SWEEP_DUTY:-10,25,50,75,100}" --duty-seconds "${SWEEP_SECONDS:-2}"
      --burst-ms "${SWEEP_BURST_MS:-3}" --sweep-on "$OUT/summary.txt" --sweep-match "ready=1")
  else
    sweep=()
  fi
fi
# every MONITOR_INTERVAL s (1: each request of a single-stream scenario gets a sample), the busy
# window after every MONITOR_BUSY_EVERY-th (5: its share of the host as beside a 5 s sampler);
# and the busy threads of vLLM's processes with the CPU each last ran on, and the reference pinned
# MONITOR_PIN_MS on the busiest ones' CPUs (the vCPU level the engine ran at, which table 15's
# unpinned sampler could not tell: host-pace-t15.md; MONITOR_THREADS= turns it off)
( python3 benchmarks/gpu/host_speed.py --interval "${MONITOR_INTERVAL:-1}" --busy "${MONITOR_BUSY:-0}" \
    --busy-every "${MONITOR_BUSY_EVERY:-5}" --threads-match "${MONITOR_THREADS-vllm}" \
    --pin-ms "${MONITOR_PIN_MS:-20}" ${sweep[@]+"${sweep[@]}"} >>"$OUT/host-speed.jsonl" 2>/dev/null &
  echo $! >"$OUT/.monitor.pid" )
trap 'kill "$(cat "$OUT/.monitor.pid")" 2>/dev/null' EXIT
for step in "$@"; do
  if [[ $step == retime ]]; then
    { echo "# retime $(date -u +%FT%TZ)"
      timeout 200 python3 -c "import os; from launcher.pipeline import hostcosts; print(hostcosts.measure(os.environ, gpus=True))" 2>&1 | tail -n 2
    } >> "$OUT/host-timings.txt"
    tail -n 1 "$OUT/host-timings.txt"
    continue
  fi
  if [[ $step == probe ]]; then
    { t0=$(date +%s)
      timeout 120 python3 -m launcher probe --measure 2>&1 | tail -n 12
      for c in ${PREDICT_CASES:-}; do
        timeout 240 python3 -m launcher probe --measure --model "$M/${MODEL[$c]}" 2>&1 | grep -E "^kernel table|Error|error" | head -n 4
        echo "$c: probe --measure --model exit ${PIPESTATUS[0]} at $(( $(date +%s) - t0 ))s"
      done; } > "$OUT/probe.txt" 2>&1
    tail -n 3 "$OUT/probe.txt"
    # the tables themselves, as one file (a call brings back at most 8)
    cache=${TOPOSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/toposerve}
    [[ -d $cache/kernels ]] && tar czf "$OUT/kernels.tgz" -C "$cache" kernels
    # and the host timing the plans after it use (one record a host, rewritten by every probe):
    # kept a copy per probe, so that a replay plans each case at its own host's timing
    # (issue22_now.py --host-timing CASE=FILE; the eleventh table kept only the probe's text)
    for f in "$cache"/host-cost/*.json; do
      [[ -f $f ]] && cp "$f" "$OUT/host-cost-${PREDICT_CASES// /-}.json"
    done
    # and the GPU's figures the probe kept for the plans after it (d0434d7; one GPU here), so
    # that a replay plans with them too (issue22_now.py --gpu-perf CASE=FILE)
    for f in "$cache"/gpu-perf/*.json; do
      [[ -f $f ]] && cp "$f" "$OUT/gpu-perf-${PREDICT_CASES// /-}.json"
    done
    continue
  fi
  if [[ $step == predict ]]; then
    for c in ${PREDICT_CASES:-moonlightd gemma12d mladef qwen06 gemma270 q3awq32 moe30 phi4 qwen15 qwen17 gemma1b granite8 q3awq14 llama2 mlalong awq70 qwen8b gemma4b qwen3b glm gemma12 awq8b qwen4b qwen14 small24 moonlight smollm2 awq14 gemma2 long14 nemo12 small qwen7b mla awq gemma long8b qwen3 small3b}; do
      for s in ${SCEN[$c]}; do
        case $s in
          single) predict "$c" single --prompt 512 --gen 256 --concurrency 1 & ;;
          c32)    predict "$c" c32 --prompt 512 --gen 256 --concurrency 32 & ;;
          long16) predict "$c" long16-c1 --prompt 16384 --gen 128 --concurrency 1 &
                  predict "$c" long16-c4 --prompt 16384 --gen 128 --concurrency 4 & ;;
          depth)  # depth 0 is the single case's TTFT
                  for d in 8000 32000; do
                    predict "$c" "depth$d" --workload agent --sessions 1 --context "$d" --prompt 512 --gen 64 &
                  done ;;
        esac
      done
    done > "$OUT/predictions${PRED_TAG:+-$PRED_TAG}.jsonl"
    wait
    wc -l "$OUT/predictions${PRED_TAG:+-$PRED_TAG}.jsonl"
    continue
  fi
  if [[ $step == profile ]]; then
    # each of $PROFILE_CASES' prompt steps on the device, kernel by kernel (prompt_profile.py):
    # the 512-token prompt, and a 16k prompt's 8,192-token chunks where the case has long16; the
    # same weights' loader, routing and utilisation as the case's serving; one engine start each
    for c in ${PROFILE_CASES:-}; do
      lens=512; [[ " ${SCEN[$c]} " == *" long16 "* ]] && lens="512 16384"
      for n in $lens; do
        VLLM_MOE_ROUTING_SIMULATION_STRATEGY=$(routing_of "$c") VLLM_ENABLE_V1_MULTIPROCESSING=0 \
          timeout 300 python3 benchmarks/gpu/prompt_profile.py "$M/${MODEL[$c]}" --dummy \
          --prompt "$n" --repeats 3 --gpu-memory-utilization "${UTIL[$c]}" \
          --out "$OUT/profile-$c-$n.jsonl" > "$OUT/profile-$c-$n.log" 2>&1
        echo "$c: profile of a $n-token prompt exit $? ($(tail -n 1 "$OUT/profile-$c-$n.jsonl" 2>/dev/null | cut -c1-160))" |
          tee -a "$OUT/summary.txt"
      done
    done
    continue
  fi
  [[ -n ${MODEL[$step]:-} ]] || { echo "unknown step $step" >&2; exit 2; }
  port=$((port + 10))
  # the MoE routing the plans assume (see glm above); vLLM reads it in the engine's processes
  routing=$(routing_of "$step")
  # a random checkpoint in place of the dummy loader's zeros (WEIGHTS, the header)
  dir=$M/${MODEL[$step]} load=dummy
  if [[ ${LOAD_WEIGHTS:-${WEIGHTS[$step]:-dummy}} == random ]]; then
    dir=${CKPT_ROOT:-/root/ckpt}/${MODEL[$step]} load=auto t0=$(date +%s)
    if ! python3 benchmarks/gpu/random_checkpoint.py "$M/${MODEL[$step]}" "$dir" \
        --device "${CKPT_DEVICE:-cuda}" >"$OUT/ckpt-$step.txt" 2>&1; then
      echo "$step: random checkpoint failed: $(tail -n 1 "$OUT/ckpt-$step.txt")" | tee -a "$OUT/summary.txt"
      rm -rf "$dir"; continue
    fi
    echo "$step: random checkpoint $(tail -n 1 "$OUT/ckpt-$step.txt") in $(( $(date +%s) - t0 ))s" |
      tee -a "$OUT/summary.txt"
  fi
  VLLM_MOE_ROUTING_SIMULATION_STRATEGY=${routing:-${VLLM_MOE_ROUTING_SIMULATION_STRATEGY:-}} \
  COMPILATION_CONFIG=$(compile_cfg "$step") LOAD_FORMAT=$load \
  PORT=$port ENGINE_PORT=$((port + 100)) bash benchmarks/gpu/run_config.sh "$step${NAME_SUFFIX:-}" \
    "$dir" "$(base "$step")" "${SCEN[$step]}"
  [[ $load == auto && ${KEEP_CKPT:-0} != 1 ]] && rm -rf "$dir"
done
