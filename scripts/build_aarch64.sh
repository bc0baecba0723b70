#!/usr/bin/env bash
# Cross-builds fusekit's wheel for linux aarch64 on an x86-64 Debian machine
# (or Ubuntu): build/wheelhouse-aarch64/fusekit-*-py3-none-manylinux_*_aarch64.whl
#
#   bash scripts/build_aarch64.sh
#
# The wheel is the x86 one's twin: same Python files, the kernel library
# compiled by aarch64-linux-gnu-g++ with NEON, SVE and SVE2 variants (run
# time dispatch).  The library is loaded with ctypes, not imported, so one
# wheel serves every Python 3 (tag py3-none).  auditwheel names the
# manylinux tag from the glibc and libstdc++ symbol versions the library
# needs (the builder's toolchain: Debian 12's glibc 2.36 / GCC 12 give
# manylinux_2_35) and checks it needs no other shared library.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

bash scripts/setup_arm64.sh
PY=.venv/bin/python
[ -x "$PY" ] || { echo "missing $PY: run scripts/setup.sh first" >&2; exit 1; }
# auditwheel's JSON report is read below: a release of known shape.
"$PY" -m pip install -q "scikit-build-core>=0.10" cmake ninja wheel "auditwheel==6.8.*"

OUT=build/wheelhouse-aarch64
rm -rf "$OUT"
mkdir -p "$OUT/raw"
printf '== cross-building the aarch64 wheel\n'
# _PYTHON_HOST_PLATFORM: the platform scikit-build-core tags the wheel
# with (sysconfig.get_platform()); the toolchain file makes CMake cross
# compile.  A build folder of its own keeps the x86 build's cache apart.
_PYTHON_HOST_PLATFORM=linux-aarch64 nice -n 10 "$PY" -m pip wheel -q --no-build-isolation \
  --no-deps -w "$OUT/raw" \
  -C cmake.args="-DCMAKE_TOOLCHAIN_FILE=$PWD/cmake/aarch64-linux-gnu.cmake" \
  -C wheel.py-api=py3 \
  -C build-dir=build/cross-aarch64 \
  .
RAW="$(ls "$OUT"/raw/fusekit-*-py3-none-linux_aarch64.whl)"

printf '== tagging it manylinux (auditwheel)\n'
# auditwheel's analysis (JSON) gives the manylinux tag the library's
# symbol versions allow and the shared libraries outside that policy
# (none expected: the plugin links only libc, libm, libgcc_s, libstdc++).
# auditwheel repair only retags wheels of the machine's own architecture,
# so the tag goes on with `wheel tags`.
"$PY" -m auditwheel show --json "$RAW" > "$OUT/auditwheel.json"
TAG="$("$PY" - "$OUT/auditwheel.json" <<'PYEOF'
import json
import sys

info = json.load(open(sys.argv[1]))
if info["external_libs"] or not info["overall_tag"].startswith("manylinux_"):
    sys.exit(f"the aarch64 library is not manylinux-compatible: {json.dumps(info)}")
print(info["overall_tag"])
PYEOF
)"
"$PY" -m wheel tags --remove --platform-tag "$TAG" "$RAW" >/dev/null
WHEEL="$(ls "$OUT"/raw/fusekit-*-"$TAG".whl)"
mv "$WHEEL" "$OUT/"
rm -rf "$OUT/raw"
WHEEL="$OUT/$(basename "$WHEEL")"
printf 'build_aarch64.sh: %s in %d s\n' "$WHEEL" "$(( $(date +%s) - start ))"
