#!/usr/bin/env bash
# GPU check of torch-qrnn, on a machine with an NVIDIA GPU: build the package with its CUDA
# kernels for this GPU only, check the compiler's resource report (no spills), run the
# tests marked `cuda`, run the GPU benchmarks, and print one short results table last.
#
# Needs python with a CUDA build of torch, nvcc, CMake, ninja, pybind11, scikit-build-core
# and pytest; downloads nothing. Each step has a time limit (200 s build, 170 s tests,
# 100 s benchmarks), so the whole check ends within 8 minutes.
#
#   tools/gpu_check.sh                 # PYTHON=python3, results under build/gpu-check
#   OUT_DIR=somewhere tools/gpu_check.sh
#
# Leaves in OUT_DIR: build.log, resource_usage.txt, tests.log, bench.log and
# BENCHMARKS-cuda.md (the results as a markdown section, dated, with the GPU's name).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT_DIR:-build/gpu-check}
mkdir -p "$OUT_DIR"
limit() { if command -v timeout >/dev/null; then timeout "$@"; else shift; "$@"; fi; }

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi); nothing to check"
  exit 2
fi
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: $PYTHON's torch sees no GPU (a CPU-only torch?); the cuda tests would all skip"
  exit 2
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
arch=${CMAKE_CUDA_ARCHITECTURES:-${arch:-native}}

echo "== build for $gpu (CUDA architecture $arch)"
t0=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} limit 200 \
  "$PYTHON" -m pip install --no-build-isolation --no-deps --no-index -v . \
  -Cbuild-dir="$OUT_DIR/build" -Ccmake.define.QRNN_CUDA=ON \
  -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" >"$OUT_DIR/build.log" 2>&1
build_rc=$?
build_s=$(($(date +%s) - t0))
if [ $build_rc -ne 0 ]; then
  tail -n 60 "$OUT_DIR/build.log"
  echo "gpu_check: build FAILED after ${build_s}s (log: $OUT_DIR/build.log)"
  exit 1
fi

echo "== compiler resource report"
"$PYTHON" tools/cuda_resource_usage.py "$OUT_DIR/build" >"$OUT_DIR/resource_usage.txt" 2>&1
spill_rc=$?
tail -n 4 "$OUT_DIR/resource_usage.txt"

echo "== tests marked cuda"
limit 170 "$PYTHON" -m pytest -m cuda tests -q -p no:cacheprovider >"$OUT_DIR/tests.log" 2>&1
test_rc=$?
grep -E "^(FAILED|ERROR)" "$OUT_DIR/tests.log" | head -n 20
tests_line=$(tail -n 1 "$OUT_DIR/tests.log")

echo "== GPU benchmarks"
limit 100 "$PYTHON" - "$OUT_DIR/BENCHMARKS-cuda.md" >"$OUT_DIR/bench.log" 2>&1 <<'EOF'
import sys
from qrnn.bench import cuda, layer
from qrnn.bench.common import format_table, machine_info, markdown_table

info = machine_info()
# ForgetMult kernels, then the layer on the GPU: cuDNN comparisons and the fused gate kernels.
results = cuda.run(quick=False) + layer.gpu(quick=False)
print(format_table(results))
with open(sys.argv[1], "w") as fh:
    fh.write(f"## CUDA kernels and layers, {info['date']}, {info['gpu']}\n\n")
    fh.write(f"torch {info['torch']}, qrnn {info['qrnn']}; reproduce with `tools/gpu_check.sh` "
             "(or `python -m qrnn.bench cuda`).\n\n")
    fh.write(markdown_table(results) + "\n")
EOF
bench_rc=$?

echo
echo "== gpu_check summary: $gpu"
echo "build (sm_$arch only): ${build_s}s; resource report: $(tail -n 1 "$OUT_DIR/resource_usage.txt")"
echo "tests -m cuda: $tests_line"
if [ $bench_rc -eq 0 ]; then cat "$OUT_DIR/bench.log"; else tail -n 30 "$OUT_DIR/bench.log"; echo "benchmarks FAILED"; fi
[ $spill_rc -eq 0 ] && [ $test_rc -eq 0 ] && [ $bench_rc -eq 0 ]
