#!/usr/bin/env bash
# The kernels on CPUs this machine is not: cross-builds the torch-free core and its C++
# kernel tests for AArch64 with Debian's g++-aarch64-linux-gnu (the toolchain file
# cmake/toolchains/aarch64-linux-gnu.cmake) and runs them under qemu-aarch64 (Debian's
# qemu-user) on three CPU models: cortex-a72 (no FP16 arithmetic), neoverse-n1 (FP16
# arithmetic) and max (everything qemu implements). Each run must use the NEON rows
# (QRNN_EXPECT_SIMD=neon: the test prints its level and fails on any other); one more
# forces QRNN_SIMD=generic. On an x86-64 host it then runs the native tests under
# qemu-x86_64 on CPUs without AVX-512 (Haswell) and without AVX (Nehalem): a build that
# carries every level must pick avx2 / generic there, never SIGILL.
#
#   bash tools/arm_check.sh       # build folders under build/arm-check (QRNN_ARM_BUILD_DIR)
#
# Installs g++-aarch64-linux-gnu and qemu-user with apt-get when missing (as root, or
# through sudo). Emulation checks correctness only: it says nothing about speed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build_root=${QRNN_ARM_BUILD_DIR:-build/arm-check}
jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
sysroot=/usr/aarch64-linux-gnu
start=$SECONDS

missing=()
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || missing+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null 2>&1 || missing+=(qemu-user)
if ((${#missing[@]})); then
  echo "=== installing ${missing[*]}"
  sudo=()
  if [ "$(id -u)" != 0 ]; then sudo=(sudo); fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi

# build DIR [cmake arguments]: the core and the kernel tests (Release, as users run them).
build() {
  local dir=$1
  shift
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DQRNN_BUILD_TESTS=ON -DQRNN_CUDA=OFF \
    -DQRNN_BUILD_PYTHON=OFF "$@" >/dev/null
  cmake --build "$dir" --parallel "$jobs" --target test_scan test_qrnn_gates
}

# check LABEL EXPECTED_LEVEL COMMAND...: runs both kernel tests, each of which prints the
# level it ran and fails unless it is EXPECTED_LEVEL.
check() {
  local label=$1 expect=$2 dir=$3
  shift 3
  for test in test_scan test_qrnn_gates; do
    echo "--- $label: $test"
    QRNN_EXPECT_SIMD=$expect "$@" "$dir/tests/cpp/$test"
  done
}

echo "=== AArch64: cross-building the core and its kernel tests"
arm="$build_root/aarch64"
build "$arm" -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake
for cpu in cortex-a72 neoverse-n1 max; do
  check "qemu-aarch64 -cpu $cpu" neon "$arm" qemu-aarch64 -L "$sysroot" -cpu "$cpu"
done
check "qemu-aarch64 -cpu max, QRNN_SIMD=generic" generic "$arm" env QRNN_SIMD=generic qemu-aarch64 -L "$sysroot" -cpu max

if [ "$(uname -m)" = x86_64 ]; then
  echo "=== x86-64: a build with every level, on emulated CPUs without AVX-512 and without AVX"
  native="$build_root/x86_64"
  build "$native"
  check "qemu-x86_64 -cpu Haswell" avx2 "$native" env -u QRNN_SIMD qemu-x86_64 -cpu Haswell
  check "qemu-x86_64 -cpu Nehalem" generic "$native" env -u QRNN_SIMD qemu-x86_64 -cpu Nehalem
fi
echo "arm_check: every emulated run passed on its expected level ($((SECONDS - start)) s)"
