#!/usr/bin/env bash
# Sets everything up, then runs the linters and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
printf '\n== ruff\n'
.venv/bin/ruff check fusekit tests examples benchmarks
printf '\n== pytest\n'
.venv/bin/pytest "$@"
