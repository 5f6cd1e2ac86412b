#!/usr/bin/env bash
# Build a vLLM 0.26.0 bundle for the lent NVIDIA H200 machines, split into parts
# that each fit one command's transfer to a lent GPU machine (64 MiB at most).
#
# usage: benchmarks/gpu/make-vllm-bundle.sh [DEST]   (from the project's root; DEST defaults to .gpu)
# result: DEST/c0, DEST/c1, DEST/c2 ... each holding one part of site.tar.xz (47 MiB, so that a part and the working tree fit one
# command's 64 MiB transfer).
# The GPU image has Python 3.12 and torch 2.11.0+cu130 (the torch vllm 0.26.0 pins),
# so only vllm itself and the packages listed beside this script travel.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEST="${1:-.gpu}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
grep -qxF "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64 manylinux1_x86_64; do
  PLAT+=(--platform "$p")
done
echo "downloading wheels (about 360 MB) ..."
python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$WORK/whl" vllm==0.26.0 \
  -r <(grep -v '^#' "$HERE/vllm-0.26.0-extra-wheels.txt")
mkdir "$WORK/site"
for w in "$WORK"/whl/*.whl; do python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$w" "$WORK/site"; done
# Prune what an H200 (sm_90) never loads: FlashAttention-2 (vLLM uses FA3 on Hopper and imports FA2
# inside a try), the optional Rust front end, Blackwell-only sources, DeepGEMM for other Pythons.
( cd "$WORK/site" && rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/vllm-rs \
    && rm -rf vllm/third_party/fmha_sm100 && rm -f vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so )
echo "compressing (a few minutes) ..."
tar -cf - -C "$WORK/site" . | xz -9 -T0 > "$WORK/site.tar.xz"
rm -rf "$DEST" && mkdir -p "$DEST"
( cd "$DEST" && split -b 47M -d "$WORK/site.tar.xz" site.tar.xz.part )
i=0
for part in "$DEST"/site.tar.xz.part*; do
  # a small remainder rides with the part before it (one command fewer; still under 64 MiB)
  if (( i > 0 )) && (( $(stat -c %s "$part") < 8 * 1024 * 1024 )); then
    mv "$part" "$DEST/c$((i-1))/"; continue
  fi
  mkdir -p "$DEST/c$i"; mv "$part" "$DEST/c$i/"; i=$((i+1))
done
du -sh "$DEST"/c*
echo "done: send $DEST/c0, then $DEST/c1, ... one per command (see README.md beside this script)"
