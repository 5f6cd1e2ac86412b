#!/usr/bin/env bash
# Set up (first run only) and run the whole test suite, static checks included.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
.venv/bin/ruff check launcher server loadgen topocommon tests benchmarks
.venv/bin/mypy
# the layering contracts of pyproject.toml's [tool.importlinter]
.venv/bin/lint-imports
exec .venv/bin/pytest "$@"
