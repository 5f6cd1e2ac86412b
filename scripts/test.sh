#!/usr/bin/env bash
# Set up (first run only) and run the whole test suite, static checks included.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python writes what it compiles (__pycache__, git-ignored): the suite starts hundreds of
# Python processes (CLI runs, proxies, stand-in engines, vLLM), and where the environment sets
# PYTHONDONTWRITEBYTECODE (as this build machine's does) each compiled every module it imported
# from source again, vLLM's ~2,600 included: a vLLM import 24 s instead of 14 s, and four
# proxy/loadgen test modules 185 s instead of 136 s with a cold cache.
unset PYTHONDONTWRITEBYTECODE
scripts/setup.sh --test
.venv/bin/ruff check launcher server loadgen topocommon tests benchmarks
.venv/bin/mypy
# the layering contracts of pyproject.toml's [tool.importlinter]
.venv/bin/lint-imports
exec .venv/bin/pytest "$@"
