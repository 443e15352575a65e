# Cross-compiling the torch-free core and its C++ tests for AArch64 Linux with Debian's
# g++-aarch64-linux-gnu; tools/arm_check.sh runs the tests under qemu-aarch64.
#   cmake -S . -B build-arm -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake -DQRNN_BUILD_TESTS=ON
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(QRNN_CROSS_PREFIX aarch64-linux-gnu- CACHE STRING "prefix of the cross tools")
set(CMAKE_C_COMPILER ${QRNN_CROSS_PREFIX}gcc)
set(CMAKE_CXX_COMPILER ${QRNN_CROSS_PREFIX}g++)

# Libraries and headers from the cross sysroot only; programs from the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# ctest runs the test programs through qemu (tools/arm_check.sh sets QEMU_CPU per run).
find_program(QRNN_QEMU_AARCH64 qemu-aarch64)
if(QRNN_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${QRNN_QEMU_AARCH64};-L;/usr/aarch64-linux-gnu)
endif()
