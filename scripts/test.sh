#!/usr/bin/env bash
# Sets everything up, then runs the linters, every pytest tier (tests/tiers.py)
# and the sanitizer run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
printf '\n== ruff\n'
.venv/bin/ruff check fusekit tests examples benchmarks
printf '\n== pytest (every tier: fast, slow, fuzz, bench)\n'
.venv/bin/pytest -m "" "$@"
# The kernel tests and a small fuzz corpus again on an ASan/UBSan build of
# the plugin (about two minutes); FUSEKIT_SANITIZE=0 leaves it out.
if [ "${FUSEKIT_SANITIZE:-1}" != 0 ]; then
  printf '\n== sanitizers\n'
  bash scripts/sanitize.sh --quick
fi
