#!/usr/bin/env bash
# Set up (first run only) and run the whole test suite, static checks included.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
.venv/bin/ruff check launcher server loadgen tests benchmarks
.venv/bin/mypy
exec .venv/bin/pytest "$@"
