#!/usr/bin/env bash
# Every saved issue-22 table replayed by the planner at this commit, one summary line each: the
# lead's protocol since session 24, in one command, so that a change to the cost model is judged
# on all of them at once (agreement, not validation: the machine's own plans are the proof).
#
#   benchmarks/gpu/issue22_replay_all.sh OUT [TABLE...]     (repo root; TABLE: t5 .. t16)
#
# Kernel-table tables (t8-t16) plan with the kernel tables each run timed; t12-t16 at their
# own host records (host-cost-CASE.json, timed by the probe on the serving machine), t8-t11 at
# the shipped host (their runs predate the record). The roofline tables (t5-t7, no kernel
# tables) twice: at the shipped host, and at their run's host (--host-speed, the probe's
# per-sequence time over the shipped host's: docs/planner.md, "After the thirteenth table").
# Every plan on the H200's NVML reading as the machines' plans read it: without the GEMM rates
# the lead's saved reading measured (issue22_now.py's machine_topology), so a table replayed at
# the planner commit its machine ran reproduces the machine's lines (issue22_now.py says so).
# t15 ran on a lent H100: its plans read that card's NVML reading (h100-table15-nvml.json, the
# reading its probe-CASE.txt printed), at the UTIL issue22-table.sh scaled to its 81,559 MiB.
# t16 ran on another lent H100 of the same model (machine-CASE.txt: NVIDIA H100 80GB HBM3, driver
# 580.159.04, 81,559 MiB; its probe-CASE.txt the same name, memory, cc, PCIe Gen5 x16, CPUs 0-15 and
# bus id, only the UUID differs), so its plans read the same reading.
set -euo pipefail
OUT=${1:?usage: issue22_replay_all.sh OUT [TABLE...]}
shift
TABLES=${*:-t5 t6 t7 t8 t9 t10 t11 t12 t13 t14 t15 t16}
PY=${PY:-.venv/bin/python}
R=benchmarks/gpu/results
declare -A DIR=([t5]=2026-12-03-h200-table5 [t6]=2026-12-03-h200-table6 [t7]=2026-12-03-h200-table7
  [t8]=2026-12-03-h200-table8 [t9]=2026-12-04-h200-table9 [t10]=2026-12-04-h200-table10
  [t11]=2026-12-04-h200-table11 [t12]=2026-12-04-h200-table12 [t13]=2026-12-04-h200-table13
  [t14]=2026-12-05-h200-table14 [t15]=2026-12-05-h100-table15
  [t16]=2026-12-05-h100-table16)
declare -A SPEED=([t5]=1.06 [t6]=1.73 [t7]=1.56)
# the NVML reading a table's plans read where it is not the H200's (issue22_now.py's default)
declare -A TOPO=([t15]=benchmarks/gpu/h100-table15-nvml.json [t16]=benchmarks/gpu/h100-table15-nvml.json)
mkdir -p "$OUT"
summary() {  # the table's summary line of issue22_table.py
  "$PY" benchmarks/gpu/issue22_table.py "$1" | grep -m1 'toposerve:' || echo "  (no summary)"
}
for t in $TABLES; do
  d=$R/${DIR[$t]}
  p=$d/predictions-measured.jsonl
  case $t in
    t5|t6|t7)
      "$PY" benchmarks/gpu/issue22_now.py "$d" "$OUT/$t-shipped" --predictions "$p" >/dev/null
      speeds=()
      for c in $("$PY" -c "import json,sys; print(' '.join(sorted({json.loads(l)['case'] for l in open(sys.argv[1]) if l.strip()})))" "$p"); do
        speeds+=(--host-speed "$c=${SPEED[$t]}")
      done
      "$PY" benchmarks/gpu/issue22_now.py "$d" "$OUT/$t-own" --predictions "$p" "${speeds[@]}" >/dev/null
      echo "$t shipped host: $(summary "$OUT/$t-shipped")"
      echo "$t own host x${SPEED[$t]}: $(summary "$OUT/$t-own")" ;;
    *)
      k=$OUT/$t-kernels
      rm -rf "$k" && mkdir -p "$k"
      for z in "$d"/kernels*.tgz; do tar xzf "$z" -C "$k"; done
      hosts=()
      [ -n "${TOPO[$t]:-}" ] && hosts+=(--topology "${TOPO[$t]}")
      for h in "$d"/host-cost-*.json; do
        [ -e "$h" ] || continue
        c=${h##*/host-cost-}; hosts+=(--host-timing "${c%.json}=$h")
      done
      # the GPU figures the probe kept for the plans after it (tables run since d0434d7)
      for g in "$d"/gpu-perf-*.json; do
        [ -e "$g" ] || continue
        c=${g##*/gpu-perf-}; hosts+=(--gpu-perf "${c%.json}=$g")
      done
      "$PY" benchmarks/gpu/issue22_now.py "$d" "$OUT/$t" --predictions "$p" --kernels "$k/kernels" \
        "${hosts[@]}" >/dev/null
      echo "$t: $(summary "$OUT/$t")" ;;
  esac
done
