#!/usr/bin/env bash
# Re-split the vLLM bundle's parts so that each fits one device call beside this checkout.
#
#   benchmarks/gpu/resplit-bundle.sh [SRC [DEST]]   (from the repo root; SRC .gpu, DEST .gpu/s)
#
# A call carries the working tree (tracked and untracked-not-ignored files) plus what it names
# in carry, 64 MiB at most. The tree grows every session (results, goldens): 29.5 MB in session
# 16, 37.7 MB in session 27, when the 29 MB parts of session 19 stopped fitting and four staging
# calls were refused. So the part size follows the tree: 64 MiB less the tree, less a 4 MiB
# margin for the session's own commits. Result: DEST/p00, DEST/p01, ... each one part named
# site.tar.xz.partNN, whose glob order (issue22-case.sh's unpack) is the bundle's byte order.
# SRC holds the bundle as parts in SRC/c*/ (make-vllm-bundle.sh's own layout) or SRC/e*/ (session
# 19's split), site.tar.xz.part* in each, globbed in order; the first layout found is used.
set -euo pipefail
SRC=${1:-.gpu} DEST=${2:-.gpu/s}
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r stat -c %s | awk '{s += $1} END {print s + 0}')
size=$(( 64 * 1024 * 1024 - tree - untracked - 4 * 1024 * 1024 ))
(( size > 4 * 1024 * 1024 )) || { echo "the tree ($tree + $untracked bytes) leaves no room for a part" >&2; exit 2; }
shopt -s nullglob
parts=()
for layout in c e; do
  for f in "$SRC"/$layout*/site.tar.xz.part*; do parts+=("$f"); done
  (( ${#parts[@]} )) && break
done
(( ${#parts[@]} )) || { echo "no bundle parts under $SRC/c*/ or $SRC/e*/ (make-vllm-bundle.sh, README.md)" >&2; exit 2; }
rm -rf "$DEST" && mkdir -p "$DEST"
cat "${parts[@]}" | split -b "$size" -d - "$DEST/site.tar.xz.part"
for f in "$DEST"/site.tar.xz.part*; do
  n=${f##*.part}; mkdir -p "$DEST/p$n"; mv "$f" "$DEST/p$n/"
done
echo "tree $((tree / 1048576)) MiB + untracked $((untracked / 1048576)) MiB: parts of $((size / 1048576)) MiB:"
du -sh "$DEST"/p*
