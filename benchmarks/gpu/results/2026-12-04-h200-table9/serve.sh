#!/usr/bin/env bash
# one case a call: bash .t9src/serve.sh CASE  (after plan.sh on this machine)
set -u
cd /root/t9src
export PYTHONPATH=/root/site:/root/t9src OUT=/root/t9 MONITOR_BUSY=1
t0=$(date +%s)
bash benchmarks/gpu/issue22-table.sh "$1"
echo "$1 done in $(( $(date +%s) - t0 ))s"
