#!/usr/bin/env bash
# The generation peers of benchmarks/bench_llm_peers.py (optional, never in
# CI: the llama.cpp build alone takes minutes on two cores):
#
#   * LiteRT-LM's Python API (litert-lm-api) into .venv;
#   * llama.cpp's llama-bench and llama-quantize, built with CMake (Unix
#     Makefiles) from the llama.cpp tree vendored in llama-cpp-python's
#     source distribution (PyPI has no llama.cpp binaries for Linux), into
#     build/peers/llama.cpp/bin; its gguf-py and convert_hf_to_gguf.py stay in
#     build/peers/llama.cpp/src for making GGUF files (torch environment).
#
#   scripts/setup_peers.sh [--skip-llama-cpp] [--skip-litert-lm] [--jobs N]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS="$ROOT/build/peers"
PY="$ROOT/.venv/bin/python"
LLAMA_CPP_PYTHON_VERSION="0.3.36"
LITERT_LM_VERSION="0.18.1"
JOBS=2
SKIP_LLAMA=0
SKIP_LITERT_LM=0
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-llama-cpp) SKIP_LLAMA=1 ;;
    --skip-litert-lm) SKIP_LITERT_LM=1 ;;
    --jobs) JOBS="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

if [ "$SKIP_LITERT_LM" = 0 ]; then
  echo "== litert-lm-api $LITERT_LM_VERSION into .venv"
  "$PY" -m pip install --quiet "litert-lm-api==$LITERT_LM_VERSION"
fi

if [ "$SKIP_LLAMA" = 0 ]; then
  echo "== llama.cpp from llama-cpp-python $LLAMA_CPP_PYTHON_VERSION's source distribution"
  mkdir -p "$PEERS/download" "$PEERS/llama.cpp"
  if [ ! -d "$PEERS/llama.cpp/src" ]; then
    "$PY" -m pip download --quiet --no-deps --no-binary :all: \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$PEERS/download"
    tar -xzf "$PEERS/download/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" \
      -C "$PEERS/download"
    cp -r "$PEERS/download/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp" \
      "$PEERS/llama.cpp/src"
  fi
  # CPU only, native SIMD, no curl (nothing is downloaded at run time).
  # Without AMX: where the CPU advertises AMX but the process is not granted
  # its tile state (some VMs), llama.cpp's repacked AMX matmul segfaults;
  # its AVX-512 VNNI repacked kernels (the fast path on such CPUs) remain.
  # -march=native would turn AMX back on, so on such CPUs the instruction
  # sets are named one by one from what the CPU reports.
  SIMD=(-DGGML_NATIVE=ON)
  if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    SIMD=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI \
        avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI \
        avx512_bf16:AVX512_BF16; do
      if grep -qw "${pair%%:*}" /proc/cpuinfo; then SIMD+=("-DGGML_${pair#*:}=ON"); fi
    done
  fi
  cmake -S "$PEERS/llama.cpp/src" -B "$PEERS/llama.cpp/build" -G "Unix Makefiles" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF "${SIMD[@]}" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON
  cmake --build "$PEERS/llama.cpp/build" -j "$JOBS" --target llama-bench llama-quantize
  mkdir -p "$PEERS/llama.cpp/bin"
  cp "$PEERS/llama.cpp/build/bin/llama-bench" "$PEERS/llama.cpp/build/bin/llama-quantize" \
    "$PEERS/llama.cpp/bin/"
  echo "llama.cpp tools in $PEERS/llama.cpp/bin"
fi
