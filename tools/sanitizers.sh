#!/usr/bin/env bash
# Builds the torch-free C++ core and its C++ tests (tests/cpp) under sanitizers and runs
# them with ctest, twice: AddressSanitizer + UndefinedBehaviorSanitizer, then
# ThreadSanitizer, each in its own build folder. Any sanitizer report fails the run.
#
#   bash tools/sanitizers.sh            # both
#   bash tools/sanitizers.sh address    # only ASan+UBSan ("thread": only TSan)
#
# Debug builds at -O1: fast to compile, still fast enough to run, and sanitizers see the
# code as written. ThreadSanitizer runs only the tests labelled "threads" (ctest -L): the
# single-threaded sweeps have nothing for it to find and run slowest under it. Build folders live under build/sanitizers (QRNN_SANITIZER_BUILD_DIR).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build_root=${QRNN_SANITIZER_BUILD_DIR:-build/sanitizers}
jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
which=${1:-all}
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi

# Stop at the first report and exit non-zero (UBSan is also built with
# -fno-sanitize-recover=all, so it aborts rather than printing and going on).
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:exitcode=23:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:detect_invalid_pointer_pairs=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=24
export TSAN_OPTIONS=halt_on_error=1:exitcode=66:second_deadlock_stack=1:report_signal_unsafe=1
export LSAN_OPTIONS=exitcode=23

run() {
  local name=$1 sanitize=$2
  shift 2  # the rest: extra ctest arguments
  local dir="$build_root/$name"
  echo "=== $name: -fsanitize=$sanitize ($dir)"
  cmake -S . -B "$dir" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" \
    -DQRNN_SANITIZE="$sanitize" -DQRNN_BUILD_TESTS=ON -DQRNN_CUDA=OFF -DQRNN_BUILD_PYTHON=OFF >/dev/null
  cmake --build "$dir" --parallel "$jobs"
  ctest --test-dir "$dir" --output-on-failure --parallel "$jobs" --no-tests=error "$@"
}

case "$which" in
  all) run asan-ubsan address,undefined; run tsan thread -L threads ;;
  address) run asan-ubsan address,undefined ;;
  thread) run tsan thread -L threads ;;
  *) echo "usage: $0 [all|address|thread]" >&2; exit 2 ;;
esac
echo "sanitizers: no reports"
