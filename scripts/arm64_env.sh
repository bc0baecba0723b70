#!/usr/bin/env bash
# An emulated aarch64 Python with fusekit's aarch64 wheel, on an x86-64
# Debian machine, without binfmt_misc or chroot; cached, safe to run again.
#
#   bash scripts/arm64_env.sh [WHEEL]     (default: the wheel scripts/build_aarch64.sh made)
#   QEMU_CPU=cortex-a72 build/arm64/python -c 'import fusekit; print(fusekit.simd_target())'
#
# build/arm64/rootfs  Debian 12 arm64 with python3, pip and libstdc++6 (mmdebstrap,
#                     --variant=extract: unpacked, no maintainer script runs), from
#                     this machine's own apt sources
# build/arm64/python  runs the rootfs' python3.11 under qemu-aarch64-static -L rootfs;
#                     QEMU_CPU picks the CPU model (default max):
#                       cortex-a72  NEON only (Raspberry Pi 4)
#                       a64fx       SVE, 512-bit vectors
#                       max         SVE2 (vector length: QEMU_CPU=max,sve-default-vector-length=BYTES)
#
# Packages go into the rootfs' /usr/local/lib/python3.11/dist-packages with
# the host's pip (--platform, --only-binary): emulated pip would take
# minutes, and an emulated process cannot start another one anyway (no
# binfmt), which also rules out a venv inside.  numpy<2 because
# tflite-runtime 2.14 needs it; ai-edge-litert 2.3 runs with it too.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
ENV_DIR="$REPO/build/arm64"
ROOTFS="$ENV_DIR/rootfs"
SITE="$ROOTFS/usr/local/lib/python3.11/dist-packages"
PIP=("$REPO/.venv/bin/python" -m pip)
REQUIREMENTS=("numpy<2" "tflite-runtime==2.14.*" "ai-edge-litert==2.3.*" "flatbuffers>=23.5")
# Every manylinux tag the rootfs' glibc (2.36, Debian 12) runs: pip's
# --platform takes the tags literally, without the older ones it implies.
PLATFORMS=(--platform manylinux2014_aarch64)
for minor in $(seq 17 36); do PLATFORMS+=(--platform "manylinux_2_${minor}_aarch64"); done

WHEEL="${1:-}"
if [ -z "$WHEEL" ]; then
  WHEEL="$(ls "$REPO"/build/wheelhouse-aarch64/fusekit-*_aarch64.whl 2>/dev/null | head -n 1)"
fi
[ -n "$WHEEL" ] && [ -f "$WHEEL" ] || {
  echo "no aarch64 fusekit wheel: run scripts/build_aarch64.sh first" >&2
  exit 1
}

bash scripts/setup_arm64.sh
mkdir -p "$ENV_DIR"
exec 9>"$ENV_DIR/.lock"
flock 9

ROOTFS_KEY="bookworm arm64 python3 python3-pip libstdc++6"
if [ "$(cat "$ENV_DIR/rootfs.done" 2>/dev/null)" != "$ROOTFS_KEY" ]; then
  printf '== arm64 root filesystem (mmdebstrap)\n'
  rm -rf "$ROOTFS" "$ENV_DIR/rootfs.done" "$ENV_DIR/packages.done"
  # The host's apt sources (deb822 or one-line files) as the mirror list.
  sources=()
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list.d/*.list; do
    [ -s "$f" ] && grep -Eq '^(deb |Types:)' "$f" && grep -Eq 'debian' "$f" && sources+=("$f")
  done
  ((${#sources[@]})) || sources=("http://deb.debian.org/debian")
  mmdebstrap --quiet --variant=extract --architectures=arm64 \
    --include=python3,python3-pip,libstdc++6 bookworm "$ROOTFS" "${sources[@]}"
  mkdir -p "$SITE"
  echo "$ROOTFS_KEY" > "$ENV_DIR/rootfs.done"
fi

# ai-edge-litert's CPU probe (the cpuinfo library, for XNNPACK and ruy)
# reads /proc/cpuinfo; under qemu-user that is this machine's x86 file, in
# which it finds no ARM core and dereferences a null pointer (a segfault in
# Interpreter() on some models, such as the keras-hub Llama one of
# tests/passes/test_keras_hub_on_arm64.py).  qemu
# opens a path under its -L prefix first when one exists there, so the
# rootfs gets an ARM /proc/cpuinfo: a Cortex-A72 entry (implementer 0x41,
# part 0xd08) per processor of this machine; the SIMD level still comes
# from QEMU_CPU (getauxval).
mkdir -p "$ROOTFS/proc"
for n in $(seq 0 $(( $(getconf _NPROCESSORS_CONF) - 1 ))); do
  printf 'processor\t: %s\nBogoMIPS\t: 100.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\n' "$n"
  printf 'CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\n'
  printf 'CPU revision\t: 3\n\n'
done > "$ROOTFS/proc/cpuinfo"

cat > "$ENV_DIR/python" <<WRAPPER
#!/bin/sh
# aarch64 Python 3.11 under user-mode emulation (made by scripts/arm64_env.sh).
: "\${QEMU_CPU:=max}"
export QEMU_CPU
exec qemu-aarch64-static -L "$ROOTFS" "$ROOTFS/usr/bin/python3.11" "\$@"
WRAPPER
chmod +x "$ENV_DIR/python"

PACKAGES_KEY="glibc 2.36 ${REQUIREMENTS[*]}"
if [ "$(cat "$ENV_DIR/packages.done" 2>/dev/null)" != "$PACKAGES_KEY" ]; then
  printf '== aarch64 wheels: %s\n' "${REQUIREMENTS[*]}"
  "${PIP[@]}" install -q --no-warn-conflicts --upgrade --target "$SITE" "${PLATFORMS[@]}" \
    --python-version 3.11 --implementation cp --only-binary=:all: "${REQUIREMENTS[@]}"
  echo "$PACKAGES_KEY" > "$ENV_DIR/packages.done"
fi

printf '== fusekit: %s\n' "$(basename "$WHEEL")"
"${PIP[@]}" install -q --no-warn-conflicts --upgrade --no-deps --target "$SITE" "${PLATFORMS[@]}" \
  --python-version 3.11 --implementation cp --only-binary=:all: "$WHEEL"

# The check runs from a folder without a fusekit/ source tree.
(cd "$ENV_DIR" && ./python -c 'import platform, fusekit, numpy, tflite_runtime, ai_edge_litert
print("arm64 env:", platform.machine(), "numpy", numpy.__version__,
      "kernels:", ", ".join(fusekit.kernel_names()), "simd:", fusekit.simd_target())')
