#!/usr/bin/env bash
# Builds fusekit's plugin with AddressSanitizer + UBSan (build/sanitize/),
# runs the kernel tests (tests/ops) and a fuzz corpus against it, and fails
# when any sanitizer report has a fusekit frame.
#
#   bash scripts/sanitize.sh                 kernel tests + 400 fuzz mutants
#   bash scripts/sanitize.sh --quick         CI size: kernel tests on litert (no conversions),
#                                            120 mutants
#   bash scripts/sanitize.sh --mutants 5000  a longer fuzz run
#
# The pip runtimes are not instrumented: every process preloads the libasan
# and libubsan of the compiler that built the plugin, and fusekit loads the
# sanitized library through FUSEKIT_LIBRARY.  The fuzzer's user plugin is
# compiled through a sanitizing compiler wrapper (build_plugin's extra_cflags
# reach the compile steps, not its link, which needs -fsanitize too).
# Reports go to build/sanitize/reports/ (one file per process).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

MUTANTS=400
QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; MUTANTS=120; shift ;;
    --mutants) MUTANTS="$2"; shift 2 ;;
    *) echo "usage: $0 [--quick] [--mutants N]" >&2; exit 2 ;;
  esac
done

OUT="$REPO/build/sanitize"
REPORTS="$OUT/reports"
SANITIZERS=address,undefined
export PATH="$REPO/.venv/bin:$PATH"  # cmake and ninja come with the dev venv
start=$(date +%s)

printf '== building the plugin with -fsanitize=%s\n' "$SANITIZERS"
cmake -S . -B "$OUT" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFUSEKIT_SANITIZE="$SANITIZERS" >/dev/null
cmake --build "$OUT"
LIB="$OUT/libfusekit_ops.so"

ASAN_LIB="$(g++ -print-file-name=libasan.so)"
UBSAN_LIB="$(g++ -print-file-name=libubsan.so)"
for lib in "$ASAN_LIB" "$UBSAN_LIB"; do
  [ -e "$lib" ] || { echo "missing $lib (apt-get install g++)" >&2; exit 1; }
done

# User plugins: the same flags on every compile and on the link.
cat > "$OUT/sanitize-g++" <<EOF
#!/bin/sh
exec g++ "\$@" -fsanitize=$SANITIZERS -fno-omit-frame-pointer -g
EOF
chmod +x "$OUT/sanitize-g++"

rm -rf "$REPORTS"
mkdir -p "$REPORTS"
export FUSEKIT_LIBRARY="$LIB"
export FUSEKIT_CACHE_DIR="$OUT/plugin_cache"
export CXX="$OUT/sanitize-g++"
export TF_CPP_MIN_LOG_LEVEL=3
# Leak reports would be the Python interpreter's own; a huge allocation a
# mutant asks a runtime for must fail as it does unsanitized, not abort.
ASAN_OPTS="detect_leaks=0:allocator_may_return_null=1:detect_odr_violation=0"
export ASAN_OPTIONS="$ASAN_OPTS:log_path=$REPORTS/asan"
export UBSAN_OPTIONS="print_stacktrace=1:log_path=$REPORTS/ubsan"
# Every Python process from here on: a sanitized library can only be loaded
# into a process whose first library is libasan.
export LD_PRELOAD="$ASAN_LIB $UBSAN_LIB"

status=0

printf '\n== kernel tests (tests/ops) on the sanitized plugin\n'
ops_args=(tests/ops -q -p no:cacheprovider -m "")  # every tier of the kernel tests
if [ "$QUICK" = 1 ]; then
  # In-process runtimes only: the tflite-runtime subprocess repeats the
  # same kernels and doubles the time.
  # Conversion tests spend their time in TensorFlow's converter, which is
  # not instrumented; the kernels they end in run in the other tests.
  ops_args+=(-k "(litert or not (tf or tflite_runtime)) and not (converts or traced or conversions)")
fi
.venv/bin/pytest "${ops_args[@]}" || status=1

printf '\n== fuzz corpus (%s mutants) through the sanitized plugin\n' "$MUTANTS"
runtimes=litert,tf,tflite_runtime
[ "$QUICK" = 1 ] && runtimes=litert,tflite_runtime
.venv/bin/python tests/fuzz/campaign.py --sanitized --mutants "$MUTANTS" --seed 3 \
  --out "$OUT/fuzz" --runtimes "$runtimes" --modes fusekit,delegate --timeout 60 \
  --regressions "$OUT/fuzz/regressions" || status=1

printf '\n== sanitizer reports\n'
# A report is fusekit's when a frame is in fusekit's sources or libraries.
FUSEKIT_FRAME='custom_ops_cc/|sdk_src/|libfusekit_ops|libfuzz_user_ops|fusekit::|examples/custom_op/'
ours=0
total=0
for report in "$REPORTS"/*; do
  [ -e "$report" ] || continue
  total=$((total + 1))
  if grep -Eq "$FUSEKIT_FRAME" "$report"; then
    ours=$((ours + 1))
    printf -- '-- %s (fusekit frame):\n' "$report"
    head -n 40 "$report"
  fi
done
printf '%d report files, %d with fusekit frames\n' "$total" "$ours"
if [ "$total" -gt "$ours" ]; then
  printf 'reports without fusekit frames (the runtimes or Python), first lines:\n'
  for report in "$REPORTS"/*; do
    [ -e "$report" ] || continue
    grep -Eq "$FUSEKIT_FRAME" "$report" || grep -m1 -E 'ERROR|runtime error' "$report" || true
  done | sort | uniq -c | sort -rn | head -n 20
fi
[ "$ours" -eq 0 ] || status=1

printf '\nsanitize.sh: %s in %d s\n' "$([ $status = 0 ] && echo passed || echo FAILED)" \
  "$(( $(date +%s) - start ))"
exit $status
