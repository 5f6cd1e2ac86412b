#!/usr/bin/env bash
# Create .venv and install toposerve with the engine that fits this machine. Idempotent: a second
# run only checks. Usage: scripts/setup.sh [--test]   (--test adds test tools and Prometheus)
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  engine=gpu
else
  engine=cpu
fi
extras="$engine"
[[ $want_test == 1 ]] && extras="$extras,dev"

stamp=".venv/.toposerve-$extras-$(sha1sum pyproject.toml | cut -c1-12)"
if [[ ! -f "$stamp" ]]; then
  [[ -x .venv/bin/python ]] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
  echo "setup: installing toposerve[$extras] into .venv (first time: a few minutes)…"
  # --no-compile: pip would byte-compile all ~27k installed modules (about a minute on two
  # cores); Python compiles the few thousand a run imports when it first imports them.
  .venv/bin/python -m pip install -q --no-compile -e ".[$extras]" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import launcher, server, loadgen" \
    || { echo "setup: install failed (see pip's messages above)"; exit 1; }
  if [[ $engine == cpu ]]; then
    # PyPI's torchvision/torchaudio/torchcodec are built against another torch and fail to load
    # beside torch 2.13.0+cpu; vLLM serves text models without them.
    .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  rm -f .venv/.toposerve-*
  touch "$stamp"
fi

if [[ $want_test == 1 ]]; then
  if ! command -v prometheus >/dev/null 2>&1 || ! command -v prometheus-pushgateway >/dev/null 2>&1; then
    echo "setup: installing Debian's prometheus and prometheus-pushgateway (tests use real ones)…"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends prometheus prometheus-pushgateway >/dev/null
  fi
fi
