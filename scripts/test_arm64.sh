#!/usr/bin/env bash
# CI step: fusekit on linux aarch64, on this x86-64 machine.  Cross-builds
# the aarch64 wheel, makes the emulated aarch64 Python (qemu user mode,
# cached under build/arm64) and runs there:
#   1. the kernel parity tests (tests/ops, their tflite-runtime cases) with
#      the tflite-runtime worker on aarch64, at a NEON-only CPU (cortex-a72)
#      and an SVE2 CPU (max);
#   2. every kernel on ai-edge-litert at every ARM SIMD level and at 128-,
#      512- and 2048-bit SVE vectors (tests/test_simd_levels.py);
#   3. the example user plugin built with build_plugin(target="aarch64");
#   4. the fused keras-hub Llama backbone of the pattern-fusion tests on both
#      runtimes at cortex-a72 (NEON) and max (SVE2), against x86's plain model.
# Emulation proves results, not speed: nothing here is timed.
#
#   bash scripts/test_arm64.sh          (scripts/test.sh runs it; FUSEKIT_ARM64=0 skips it there)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start )) s"; }

bash scripts/build_aarch64.sh
printf '   (%s)\n' "$(elapsed)"
bash scripts/arm64_env.sh
printf '   (%s)\n' "$(elapsed)"

export FUSEKIT_ARM64_PYTHON="$REPO/build/arm64/python"
# The emulated processes load the aarch64 wheel's library, never an
# override meant for this machine.
unset FUSEKIT_LIBRARY FUSEKIT_SIMD
export TF_CPP_MIN_LOG_LEVEL=3
# From the repository root, so that the tests import this checkout; every
# tier (-m ""): the tflite-runtime cases and the plugin tests are in the
# slow one, which the default run leaves out (pytest then exits 5).
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider -m "")
status=0

# NEON: every tflite-runtime case of tests/ops.  SVE2: the same without the
# bad-input cases, which the SDK refuses before any SIMD code runs (they
# passed at NEON; each one is an emulated process start).
for cpu in cortex-a72 max; do
  select=tflite_runtime
  [ "$cpu" = max ] && select="tflite_runtime and not bad_input and not mixed_dtypes"
  printf '\n== kernel parity tests, tflite-runtime on aarch64 (QEMU_CPU=%s)\n' "$cpu"
  QEMU_CPU="$cpu" FUSEKIT_TFLITE_RUNTIME_PYTHON="$FUSEKIT_ARM64_PYTHON" \
    "${PYTEST[@]}" tests/ops -k "$select" || status=1
  printf '   (%s)\n' "$(elapsed)"
done

printf '\n== every kernel at every ARM SIMD level, ai-edge-litert on aarch64\n'
"${PYTEST[@]}" tests/test_simd_levels.py -k arm || status=1
printf '   (%s)\n' "$(elapsed)"

printf '\n== a user plugin cross-built for aarch64\n'
"${PYTEST[@]}" tests/test_user_plugin.py -k aarch64 || status=1
printf '   (%s)\n' "$(elapsed)"

printf '\n== the fused keras-hub Llama backbone on aarch64 (NEON and SVE2, both runtimes)\n'
"${PYTEST[@]}" tests/passes/test_keras_hub_on_arm64.py || status=1

# CPU seconds of this step's processes: on a busy machine the wall time
# says more about the neighbours than about the step.
# `times`' second line: the children's user and system time, as 6m19.2s
# (read from a file: in a command substitution it would be the subshell's).
times > "$REPO/build/arm64/times.txt"
cpu="$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/)
  printf "%.0f s user, %.0f s system", u[1] * 60 + u[2], s[1] * 60 + s[2] }' \
  "$REPO/build/arm64/times.txt")"
printf '\ntest_arm64.sh: %s in %s (CPU time of its processes: %s)\n' \
  "$([ $status = 0 ] && echo passed || echo FAILED)" "$(elapsed)" "$cpu"
exit $status
