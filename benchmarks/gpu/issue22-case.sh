#!/usr/bin/env bash
# One of issue 22's table cases in one device call, planned on the machine that serves it:
#
#   bash benchmarks/gpu/issue22-case.sh CASE     (from the snapshot the call carries, below)
#
# A call that does not come back loses everything in it, and a machine can be released between
# calls, after which the next one is a different host (the ninth table's second machine ran the
# host's reference workload 1.75x faster than the first, which had planned its case). So each
# call plans its own case on its own host right before serving it:
#   1. the bundle unpacked into /root/site if this machine has not got it yet (its parts
#      staged in /root/stage by the calls before, as README.md says);
#   2. the shipped profile's plans (predictions-shipped-CASE.jsonl), before anything else;
#   3. `probe --measure` and `probe --measure --model` of the case (issue22-table.sh probe);
#   4. the primary plans (predictions-measured-CASE.jsonl), named in PRIMARY.txt with the time,
#      before the engine starts;
#   5. the case served and measured (issue22-table.sh CASE).
# Results under $OUT (default /root/t9), as issue22-table.sh writes them; the call then tars
# them back. Time: unpack ~5 s, probe 100-130 s (host ~40 s, a model's table 60-90 s), plans
# ~20 s, a start 130-270 s and the scenarios 20-60 s: ~300-500 s, under one call's 600.
# The snapshot: SNAP=.t9src, made as README.md says (git archive of the planner and these
# scripts, with a REV file naming the commit); the call carries .gpu/d4 and $SNAP.
set -u
case_=${1:?usage: issue22-case.sh CASE}
snap=${SNAP:-.t9src}
export OUT=${OUT:-/root/t9}
mkdir -p /root/site "$OUT"
t0=$(date +%s)
if [[ ! -d /root/site/vllm ]]; then
  # a machine released between calls comes back bare: without the bundle the probe would time
  # torch alone and the start would fail, so stop here (the tenth table lost two calls so)
  if ! compgen -G "/root/stage/site.tar.xz.part*" >/dev/null; then
    echo "$case_: no vLLM bundle staged in /root/stage (a fresh machine): stage the bundle's parts first (.gpu/s/pNN from resplit-bundle.sh, one call each)" >&2
    exit 3
  fi
  cat /root/stage/site.tar.xz.part* | xz -d -T16 | tar -xf - -C /root/site
  tar xzf .gpu/d4/pylib.tgz -C /root/site
  echo "unpacked in $(( $(date +%s) - t0 ))s"
fi
[[ -f /root/site/vllm/__init__.py && -d /root/site/rich ]] ||
  { echo "$case_: no vLLM or pylib in /root/site: the staged bundle is incomplete" >&2; exit 3; }
rm -rf /root/src && cp -r "$snap" /root/src
cd /root/src
export PYTHONPATH=/root/site:/root/src MONITOR_BUSY=${MONITOR_BUSY:-1} MONITOR_SWEEP=${MONITOR_SWEEP:-1}
S=benchmarks/gpu/issue22-table.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  grep -m1 "model name" /proc/cpuinfo; } > "$OUT/machine-$case_.txt"
# in a cache of their own: on a machine that served a case before, the shared cache holds that
# case's probe (host timing; since d0434d7 the GPU's GEMM rates too), which a plan takes up
TOPOSERVE_CACHE=$(mktemp -d) PREDICT_CASES=$case_ PRED_TAG=shipped-$case_ bash $S predict
PREDICT_CASES=$case_ bash $S probe
cp "$OUT/probe.txt" "$OUT/probe-$case_.txt"
PREDICT_CASES=$case_ PRED_TAG=measured-$case_ bash $S predict
echo "primary $case_: predictions-measured-$case_.jsonl (planner $(cat REV 2>/dev/null || echo ?)," \
  "made $(date -u +%FT%TZ) on $(hostname), before its engine started)" | tee -a "$OUT/PRIMARY.txt"
# STAMPS=1: vLLM's front end and engine core stamped from the case's first scenario to c32's end
# (benchmarks/vllm_frontend_order/with_stamps.sh: stamps.py as sitecustomize in each Python of
# the serving, rows kept from c32's start to its loadgen JSON; the hooks, a clock read and a deque
# append each, stay in for the whole start; no step is slept on a GPU) -> ev-PID.jsonl in
# $OUT/CASE/ (so in CASE.tgz) and a line in summary.txt; read, once CASE.tgz is unpacked:
#   python3 benchmarks/gpu/burst_stamps.py CASE_DIR      (a hook that failed: a patchfail line)
# The snapshot must hold benchmarks/vllm_frontend_order/ (README.md's git archive names only
# benchmarks/gpu/*.sh and *.py): without it the case is served as without STAMPS, and said so.
W=benchmarks/vllm_frontend_order/with_stamps.sh
if [[ ${STAMPS:-0} == 1 && -f $W && -f ${W%/*}/stamps.py ]]; then
  # from the first scenario on (the single-stream requests' steps too: host-threads-t16.md)
  STAMPS_FROM=${STAMPS_FROM:-scenarios-begun} SUMMARY=$OUT/summary.txt bash $W "$OUT/$case_${NAME_SUFFIX:-}" bash $S "$case_"
else
  [[ ${STAMPS:-0} == 1 ]] && echo "$case_: STAMPS=1 but the snapshot has no $W: served without stamps" |
    tee -a "$OUT/summary.txt"
  bash $S "$case_"
fi
# PROFILE=1: then its prompt steps on the device, kernel by kernel, after the serving (one more
# engine start, ~60-120 s: the figures come from the served engine first)
[[ ${PROFILE:-0} == 1 ]] && PROFILE_CASES=$case_ bash $S profile
echo "$case_: call done in $(( $(date +%s) - t0 ))s"
