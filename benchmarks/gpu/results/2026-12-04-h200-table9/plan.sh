#!/usr/bin/env bash
# call 6 of the ninth table: unpack the bundle, plan, probe, plan again, name the primary file
set -u
mkdir -p /root/site /root/t9
t0=$(date +%s)
cat /root/stage/site.tar.xz.part* | xz -d -T16 | tar -xf - -C /root/site
tar xzf .gpu/d4/pylib.tgz -C /root/site
rm -rf /root/t9src && cp -r .t9src /root/t9src
echo "unpacked in $(( $(date +%s) - t0 ))s"
cd /root/t9src
export PYTHONPATH=/root/site:/root/t9src OUT=/root/t9 MONITOR_BUSY=1
S=benchmarks/gpu/issue22-table.sh; C="q3awq32 moe30 phi4"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt; lscpu > $OUT/lscpu.txt
PREDICT_CASES="$C" PRED_TAG=shipped bash $S predict
echo "shipped plans done $(date -u +%FT%TZ)"
PREDICT_CASES="$C" bash $S probe
PREDICT_CASES="$C" PRED_TAG=measured bash $S predict
echo "primary: predictions-measured.jsonl (planner $(cat REV 2>/dev/null), made $(date -u +%FT%TZ), before any engine started)" > $OUT/PRIMARY.txt
cat $OUT/PRIMARY.txt; echo "call done in $(( $(date +%s) - t0 ))s"
