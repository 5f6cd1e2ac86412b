#!/usr/bin/env bash
# Set up (first run only) and serve: the embedded tiny model on the CPU, or --model on GPUs.
# On the CPU the first serve times the engine once it is up and plans from that timing (kept in
# the cache for every later plan here; --no-calibrate skips it).
# Everything after the script name is passed to `launcher serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/launcher serve "$@"
