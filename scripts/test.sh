#!/usr/bin/env bash
# Sets everything up, then runs the linters, every pytest tier (tests/tiers.py)
# and the sanitizer run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The torch environment first: the torch tier below runs in it, and the
# bench tier's LLM-peers run exports its models with litert-torch.
if [ "${FUSEKIT_TORCH:-1}" != 0 ]; then
  bash scripts/setup_torch.sh
fi
printf '\n== ruff\n'
.venv/bin/ruff check fusekit tests examples benchmarks
printf '\n== pytest (every tier: fast, slow, fuzz, bench)\n'
.venv/bin/pytest -m "" "$@"
# The torch tier: real litert-torch exports, in .venv-torch (about two
# minutes after its setup); FUSEKIT_TORCH=0 leaves it out.
if [ "${FUSEKIT_TORCH:-1}" != 0 ]; then
  printf '\n== pytest (torch tier, .venv-torch)\n'
  .venv-torch/bin/python -m pytest -m torch tests/torch
fi
# The kernel tests and a small fuzz corpus again on an ASan/UBSan build of
# the plugin (about ten minutes); FUSEKIT_SANITIZE=0 leaves it out.
if [ "${FUSEKIT_SANITIZE:-1}" != 0 ]; then
  printf '\n== sanitizers\n'
  bash scripts/sanitize.sh --quick
fi
# fusekit on aarch64: cross-built wheel, kernel tests under qemu (about ten
# minutes, docs/arm64.md); FUSEKIT_ARM64=0 leaves it out.
if [ "${FUSEKIT_ARM64:-1}" != 0 ]; then
  printf '\n== aarch64 (emulated)\n'
  bash scripts/test_arm64.sh
fi
