#!/usr/bin/env bash
# System packages for building fusekit for linux aarch64 on an x86-64 Debian
# machine and running the result under user-mode emulation; safe to run
# again.  Adds the arm64 architecture to dpkg, then installs beside the
# amd64 packages: the aarch64 cross compiler, the arm64 Highway and
# flatbuffers headers, qemu-user-static (no binfmt_misc needed: the tests
# call qemu-aarch64-static themselves) and mmdebstrap (an arm64 Debian
# root filesystem for the emulated Python, see scripts/arm64_env.sh).
set -euo pipefail

PACKAGES=(g++-aarch64-linux-gnu libhwy-dev:arm64 libflatbuffers-dev:arm64
  qemu-user-static mmdebstrap)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  printf '== adding the arm64 architecture to dpkg\n'
  $SUDO dpkg --add-architecture arm64
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  printf '== installing %s\n' "${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
fi
