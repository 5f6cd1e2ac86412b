#!/usr/bin/env bash
# CMD run with stamps.py as sitecustomize in each of its Python processes (vLLM's API server and
# engine core, the proxy, loadgen: `launcher serve` passes its environment to its children whole,
# launcher/engine/serve.py Runner.engine_child), rows kept while CASE_DIR's c32 scenario runs:
# from run_config.sh's gpu-metrics.txt (made as c32 begins) to c32.json (loadgen's, at its end);
# STAMPS_FROM=scenarios-begun opens the gate as the first scenario begins instead (the
# single-stream scenario's steps stamped too: a host-bound case's per-request step times).
#
#   bash benchmarks/vllm_frontend_order/with_stamps.sh CASE_DIR CMD...
#
# issue22-case.sh's STAMPS=1 runs its case so (CASE_DIR $OUT/CASE); on a CPU, e.g.
#   OUT=/tmp/s bash benchmarks/vllm_frontend_order/with_stamps.sh /tmp/s/cpu \
#     bash benchmarks/gpu/run_config.sh cpu ~/.cache/toposerve/models/tiny-llama-v1 "" c32
# -> CASE_DIR/ev-PID.jsonl (inside CASE_DIR.tgz once run_config.sh has packed it); read with
#   python3 benchmarks/gpu/burst_stamps.py CASE_DIR
# No step is slept: H75_STEP_MS and H75_US_PER_TOKEN are 0 here (run.sh's CPU stand-in for a GPU
# step only).
set -u
sd=${1:?usage: with_stamps.sh CASE_DIR CMD...}; shift
here=$(cd "$(dirname "$0")" && pwd)
sc=$(dirname "$sd")/.stamps
from=${STAMPS_FROM:-gpu-metrics.txt}
[[ $from == */* || -z $from ]] && { echo "with_stamps.sh: STAMPS_FROM is a file name in CASE_DIR: $from" >&2; exit 2; }
mkdir -p "$sc" "$sd" && rm -f "$sd"/ev-*.jsonl "$sd/gpu-metrics.txt" "$sd/c32.json" "$sd/$from"
cp "$here/stamps.py" "$sc/sitecustomize.py"
PYTHONPATH=$sc${PYTHONPATH:+:$PYTHONPATH} H75_EV=$sd H75_GATE=$sd/$from:$sd/c32.json \
  H75_STEP_MS=0 H75_US_PER_TOKEN=0 "$@"
rc=$?
n=$(ls "$sd"/ev-*.jsonl 2>/dev/null | wc -l)
[[ -f $sd.tgz ]] && n=$(tar tzf "$sd.tgz" | grep -c '/ev-[0-9]*\.jsonl$')
fails=$( { cat "$sd"/ev-*.jsonl 2>/dev/null; [[ -f $sd.tgz ]] && tar xzOf "$sd.tgz" --wildcards '*/ev-*.jsonl'; } |
  grep -c '"patchfail"\|"stampfail"')
echo "$(basename "$sd"): stamps in $n ev-PID.jsonl files, $fails hooks failed (burst_stamps.py names them)" |
  tee -a "${SUMMARY:-/dev/null}"
exit $rc
