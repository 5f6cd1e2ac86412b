#!/usr/bin/env bash
# Set up (first run only) and serve: the embedded tiny model on the CPU, or --model on GPUs.
# Everything after the script name is passed to `launcher serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/launcher serve "$@"
