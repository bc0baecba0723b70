#!/usr/bin/env bash
# Sets up everything fusekit needs on a Debian machine; safe to run again.
#   - system packages: a C++ compiler, flatbuffers and Highway headers
#   - .venv: fusekit with TensorFlow (convert extra) and the dev tools
#   - .venv-tflite-runtime: tflite-runtime 2.14 (numpy<2) with fusekit
#     installed without TensorFlow, from the same wheel (kernels built once)
set -euo pipefail
cd "$(dirname "$0")/.."
# One setup at a time: parallel runs would build the same virtual environments.
exec 8>"${TMPDIR:-/tmp}/fusekit-setup.lock"
flock 8

say() { printf '\n== %s\n' "$*"; }
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"

missing=()
for pkg in g++ libflatbuffers-dev libhwy-dev bazel-bootstrap; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  say "installing system packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

say "main environment (.venv)"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "scikit-build-core>=0.10" cmake ninja

say "building the fusekit wheel (C++ kernels)"
rm -rf build/wheelhouse
.venv/bin/python -m pip wheel -q --no-build-isolation --no-deps -w build/wheelhouse .
WHEEL="$(ls build/wheelhouse/fusekit-*.whl)"

say "installing fusekit[convert,dev,bench] into .venv"
.venv/bin/python -m pip install -q "${WHEEL}[convert,dev,bench]"
# keras-hub without its dependencies (tensorflow-text would bring the full
# tensorflow wheel over tensorflow-cpu); the bench extra has what it imports.
.venv/bin/python -m pip install -q --no-deps "keras-hub==0.32.*"
.venv/bin/python -m pip install -q --force-reinstall --no-deps "$WHEEL"

say "tflite-runtime environment (.venv-tflite-runtime)"
[ -x .venv-tflite-runtime/bin/python ] || "$PYTHON" -m venv .venv-tflite-runtime
.venv-tflite-runtime/bin/python -m pip install -q --upgrade pip
# ai-edge-litert beside it: tests load both runtimes in one process (the
# registerer must tell them apart); fusekit itself does not need it there.
.venv-tflite-runtime/bin/python -m pip install -q "numpy<2" "tflite-runtime==2.14.*" \
  "ai-edge-litert>=2.3" "$WHEEL"
.venv-tflite-runtime/bin/python -m pip install -q --force-reinstall --no-deps "$WHEEL"

say "checking the installs"
# -P: import the installed package, not the source folder under the cwd.
.venv/bin/python -P -c 'import fusekit; print("fusekit", fusekit.__version__, "kernels:", ", ".join(fusekit.kernel_names()), "simd:", fusekit.simd_target())'
.venv-tflite-runtime/bin/python -P -c 'import fusekit, tflite_runtime, sys; assert "tensorflow" not in sys.modules; print("tflite-runtime", tflite_runtime.__version__, "kernels:", ", ".join(fusekit.kernel_names()))'

# From the repository root a script imports the source folder; it must find
# the compiled parts of the installed package.
.venv/bin/python -c 'import fusekit; fusekit.kernel_names()'
