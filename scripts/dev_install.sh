#!/usr/bin/env bash
# Developer loop: rebuild the wheel from the working tree and reinstall it
# (no dependency changes) into both virtual environments made by setup.sh.
# Serialized with a lock so that parallel runs do not interleave installs.
set -euo pipefail
cd "$(dirname "$0")/.."
exec 9>"${TMPDIR:-/tmp}/fusekit-dev-install.lock"
flock 9
rm -rf build/wheelhouse
.venv/bin/python -m pip wheel -q --no-build-isolation --no-deps -w build/wheelhouse .
WHEEL="$(ls build/wheelhouse/fusekit-*.whl)"
.venv/bin/python -m pip install -q --force-reinstall --no-deps "$WHEEL"
.venv-tflite-runtime/bin/python -m pip install -q --force-reinstall --no-deps "$WHEEL"
