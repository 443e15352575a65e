#!/usr/bin/env bash
# GPU check of torch-qrnn, on a machine with an NVIDIA GPU. Every part runs on its own and
# is reported on its own, so one failure never hides the others' results:
#
#   env          GPU name and compute capability, driver, nvcc, torch and its CUDA
#   build        pip install of this tree with the CUDA kernels for this GPU only
#   library      the build information and the CUDA symbols the qrnn library exports
#   smoke        float32 ForgetMult and fused gates forward+backward against the CPU
#   resources    the compiler's resource report: registers, no spills
#   tests        pytest -m cuda
#   bench-fm     the ForgetMult benchmarks (python -m qrnn.bench cuda)
#   bench-layer  the layer benchmarks on the GPU
#   memcheck     compute-sanitizer memcheck on the odd-layout and poisoned-output tests
#   racecheck    compute-sanitizer racecheck on the chunked schedule (shared memory)
#   synccheck    compute-sanitizer synccheck on the chunked schedule (barriers)
#
# then one results table, last, whatever failed; the exit status is 1 if any part failed
# (or timed out), else 0. Parts that need the build are skipped when it failed, and the
# sanitizer parts when compute-sanitizer is not installed. The whole
# check keeps within QRNN_GPU_CHECK_BUDGET_S seconds (default 470, under 8 minutes): each
# part has its own time limit, cut to what is left of the budget.
#
# Needs python with a CUDA build of torch, nvcc, CMake, ninja, pybind11, scikit-build-core
# and pytest; downloads nothing (pip runs with --no-build-isolation --no-deps --no-index).
#
#   tools/gpu_check.sh                          # PYTHON=python3, results under build/gpu-check
#   OUT_DIR=somewhere tools/gpu_check.sh
#   QRNN_GPU_CHECK_PARTS="env smoke tests" tools/gpu_check.sh   # only these parts
#   QRNN_GPU_CHECK_DRY_RUN=1 tools/gpu_check.sh  # run nothing, print the plan and the table
#   QRNN_GPU_CHECK_FAIL="smoke tests" ...        # these parts fail without running (tests
#                                                # of this script)
#
# Leaves in OUT_DIR one log per part (<part>.log), resource_usage.txt, summary.txt (the
# table) and BENCHMARKS-cuda.md (the benchmark parts that finished, as a markdown section
# dated and with the GPU's name).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT_DIR:-build/gpu-check}
BUDGET_S=${QRNN_GPU_CHECK_BUDGET_S:-470}
DRY_RUN=${QRNN_GPU_CHECK_DRY_RUN:-0}
FORCED_FAIL=" ${QRNN_GPU_CHECK_FAIL:-} "
ALL_PARTS="env build library smoke resources tests bench-fm bench-layer memcheck racecheck synccheck"
SELECTED=" ${QRNN_GPU_CHECK_PARTS:-$ALL_PARTS} "
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
START=$(date +%s)

names=() states=() seconds=() notes=()
record() { names+=("$1"); states+=("$2"); seconds+=("$3"); notes+=("$4"); }
state_of() {  # the recorded state of a part, or "none"
    local i
    for i in "${!names[@]}"; do [ "${names[$i]}" = "$1" ] && { echo "${states[$i]}"; return; }; done
    echo none
}

# run_part NAME LIMIT_S NEEDS SUMMARY_FN -- COMMAND...: runs COMMAND into OUT_DIR/NAME.log
# under min(LIMIT_S, what is left of the budget). NEEDS: a part that must have passed first
# ("-" for none). SUMMARY_FN prints the table's note from the log ("-" for its last line).
run_part() {
    local name=$1 limit=$2 needs=$3 summary=$4
    shift 5
    local log="$OUT_DIR/$name.log"
    case "$SELECTED" in *" $name "*) ;; *) return 0 ;; esac
    echo
    echo "== $name"
    if [ "$needs" != "-" ]; then
        case "$(state_of "$needs")" in
            FAIL | TIMEOUT | SKIP)
                echo "skipped: $needs did not pass"
                record "$name" SKIP 0 "needs $needs"
                return 0 ;;
        esac
    fi
    case "$FORCED_FAIL" in
        *" $name "*)
            echo "forced failure (QRNN_GPU_CHECK_FAIL)" | tee "$log"
            record "$name" FAIL 0 "forced (QRNN_GPU_CHECK_FAIL)"
            return 0 ;;
    esac
    if [ "$DRY_RUN" = 1 ]; then
        echo "dry run: would run (limit ${limit}s): $*"
        record "$name" DRY 0 "not run"
        return 0
    fi
    local left=$((BUDGET_S - ($(date +%s) - START)))
    if [ "$left" -lt 10 ]; then
        echo "skipped: the ${BUDGET_S}s budget is spent"
        record "$name" SKIP 0 "no time left in the budget"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local t0 rc
    t0=$(date +%s)
    # Parts are shell functions: run them in a child bash (exported below) under timeout.
    if command -v timeout >/dev/null; then
        timeout -k 10 "$limit" bash -c 'set -o pipefail; "$@"' part "$@" >"$log" 2>&1
    else
        bash -c 'set -o pipefail; "$@"' part "$@" >"$log" 2>&1
    fi
    rc=$?
    local took=$(($(date +%s) - t0)) state=PASS note
    if [ "$summary" = "-" ]; then note=$(grep -v '^\s*$' "$log" | tail -n 1); else note=$("$summary" "$log"); fi
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        state=TIMEOUT
        note="over ${limit}s; ${note}"
    elif [ $rc -eq 77 ]; then  # the part cannot run here (a tool is missing): not a failure
        state=SKIP
    elif [ $rc -ne 0 ]; then
        state=FAIL
        note="exit $rc; ${note}"
    fi
    if [ $state = PASS ]; then tail -n 15 "$log"; else tail -n 40 "$log"; fi
    echo "-> $state in ${took}s (log: $log)"
    record "$name" "$state" "$took" "${note:0:110}"
}

# A pytest run in which no test passed (all skipped: no GPU, or no CUDA build) checked
# nothing, so it fails the part.
must_pass() {
    local out rc
    out=$(mktemp)
    "$@" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ] && ! grep -qE "[0-9]+ passed" "$out"; then
        echo "gpu_check: no test passed (all skipped?)"
        rc=1
    fi
    rm -f "$out"
    return "$rc"
}
pytest_summary() { grep -E "(passed|failed|error|skipped|no tests ran)" "$1" | tail -n 1; }
sanitizer_summary() {
    if grep -qE "ERROR SUMMARY|(passed|failed) in" "$1"; then
        grep -E "ERROR SUMMARY|(passed|failed) in" "$1" | tail -n 2 | tr '\n' ' '
    else
        grep -v '^\s*$' "$1" | tail -n 1
    fi
}
spill_summary() { tail -n 1 "$1"; }

# ---- env ----------------------------------------------------------------------------
gpu="(no GPU)"
arch=${CMAKE_CUDA_ARCHITECTURES:-}
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
    [ -n "$arch" ] || arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
fi
arch=${arch:-90}
env_part() {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "repository: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    local ok=0
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv || ok=1
        nvidia-smi | sed -n '1,4p'   # the banner names the driver's highest CUDA version
    else
        echo "nvidia-smi: not found"
        ok=1
    fi
    if command -v nvcc >/dev/null; then nvcc --version | tail -n 2; else echo "nvcc: not found"; ok=1; fi
    "$PYTHON" - <<'EOF' || ok=1
import sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, torch.version.cuda {torch.version.cuda}")
if not torch.cuda.is_available():
    sys.exit("torch sees no GPU (a CPU-only torch, or no driver)")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB, "
          f"{p.multi_processor_count} SMs")
import ctypes
version = ctypes.c_int(0)
ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
print(f"driver supports CUDA {version.value // 1000}.{version.value % 1000 // 10} (cuDriverGetVersion {version.value})")
EOF
    return $ok
}
export PYTHON OUT_DIR arch
export -f env_part must_pass
run_part env 60 - - -- env_part

# ---- build --------------------------------------------------------------------------
build_part() {
    echo "building for sm_$arch"
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
        "$PYTHON" -m pip install --no-build-isolation --no-deps --no-index -v . \
        -Cbuild-dir="$OUT_DIR/build" -Ccmake.define.QRNN_CUDA=ON \
        -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch"
}
build_summary() { if grep -q "Successfully installed" "$1"; then echo "sm_$arch"; else grep -iE "error" "$1" | tail -n 1; fi; }
export -f build_part
run_part build 200 - build_summary -- build_part

# ---- library ------------------------------------------------------------------------
library_part() {
    "$PYTHON" -c "import json, qrnn; print(json.dumps(qrnn.build_info(), indent=1))" || return 1
    local lib
    lib=$("$PYTHON" - <<'EOF'
import qrnn  # the library this python loads (an editable install keeps it apart from the sources)
print(next((line.split()[-1] for line in open("/proc/self/maps") if "/libqrnn" in line), ""))
EOF
)
    [ -n "$lib" ] || { echo "libqrnn not found in the package"; return 1; }
    echo "library: $lib"
    # The static CUDA runtime should stay private: exported cuda* symbols could bind to
    # (or be bound by) torch's own runtime.
    echo "exported CUDA symbols (defined, dynamic):"
    nm -D --defined-only "$lib" | grep -iE " (cuda|__cuda|cu[A-Z])" | head -n 40
    echo "count: $(nm -D --defined-only "$lib" | grep -ciE " (cuda|__cuda|cu[A-Z])")"
}
library_summary() { grep -E "^count:" "$1" | sed 's/count:/exported CUDA symbols:/'; }
export -f library_part
run_part library 30 build library_summary -- library_part

# ---- smoke --------------------------------------------------------------------------
smoke_part() {
    "$PYTHON" - <<'EOF'
import torch, qrnn
from qrnn.ops.core import cuda as cuda_backend
assert cuda_backend.AVAILABLE, "this build has no CUDA kernels"
torch.manual_seed(0)
# ForgetMult, float32, odd sizes (scalar and vector paths), against float64 on the CPU.
T, B, H = 23, 3, 37
f = torch.rand(T, B, H).mul(0.9).add(0.05)
x, h0, grad = torch.randn(T, B, H), torch.randn(B, H), torch.randn(T, B, H)
ref = [t.double().requires_grad_() for t in (f, x, h0)]
want = qrnn.forget_mult(*ref)
want.backward(grad.double())
dev = [t.cuda().requires_grad_() for t in (f, x, h0)]
got = qrnn.forget_mult(*dev)
got.backward(grad.cuda())
torch.cuda.synchronize()
for name, a, b in [("h", got, want)] + [(f"grad {n}", d.grad, r.grad) for n, d, r in zip("f x h0".split(), dev, ref)]:
    err = (a.detach().double().cpu() - b.detach()).abs().max().item()
    print(f"forget_mult float32 {name}: max |error| vs float64 {err:.2e}")
    assert err < 1e-4, (name, err)
# The QRNN layer (one GEMM and the fused gate kernels), against the same layer on the CPU.
layer = qrnn.QRNN(16, 32, num_layers=2)
inp = torch.randn(9, 4, 16)
want, _ = layer(inp)
out, _ = layer.cuda()(inp.cuda())
out.sum().backward()
torch.cuda.synchronize()
err = (out.detach().cpu() - want.detach()).abs().max().item()
print(f"QRNN layer float32 output: max |error| vs the CPU {err:.2e}")
assert err < 1e-4, err
assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())
print("smoke: ok")
EOF
}
export -f smoke_part
run_part smoke 60 build - -- smoke_part

# ---- resources ----------------------------------------------------------------------
resources_part() { "$PYTHON" tools/cuda_resource_usage.py "$OUT_DIR/build" | tee "$OUT_DIR/resource_usage.txt"; }
export -f resources_part
run_part resources 30 build spill_summary -- resources_part

# ---- tests --------------------------------------------------------------------------
run_part tests 150 build pytest_summary -- \
    must_pass "$PYTHON" -m pytest -m cuda tests -q -p no:cacheprovider

# ---- benchmarks ---------------------------------------------------------------------
bench() {  # bench MODULE_CALL OUT_MD: one benchmark suite, its rows kept as markdown
    "$PYTHON" - "$1" "$2" <<'EOF'
import sys
from qrnn.bench import cuda, layer
from qrnn.bench.common import format_table, markdown_table
results = {"cuda": lambda: cuda.run(quick=False), "layer": lambda: layer.gpu(quick=False)}[sys.argv[1]]()
if results:
    print(format_table(results))
with open(sys.argv[2], "w") as fh:
    fh.write(markdown_table(results) + "\n")
# A group that raised is kept as a failed row (the others' figures stay): the part fails,
# as it does when there is no figure at all (no GPU, or no CUDA kernels in this build).
sys.exit(1 if not results or any("benchmark failed" in r.name for r in results) else 0)
EOF
}
rm -f "$OUT_DIR/bench-fm.md" "$OUT_DIR/bench-layer.md"
bench_summary() {
    if grep -qE "  (NOT )?met( |$)" "$1"; then
        echo "targets: $(grep -cE "  met( |$)" "$1") met, $(grep -c "NOT met" "$1") not met;" \
            "$(grep -c "benchmark failed" "$1") groups failed"
    else
        grep -v '^\s*$' "$1" | tail -n 1
    fi
}
export -f bench
run_part bench-fm 70 build bench_summary -- bench cuda "$OUT_DIR/bench-fm.md"
run_part bench-layer 60 build bench_summary -- bench layer "$OUT_DIR/bench-layer.md"

if [ -f "$OUT_DIR/bench-fm.md" ] || [ -f "$OUT_DIR/bench-layer.md" ]; then
    "$PYTHON" - "$OUT_DIR" <<'EOF' || echo "gpu_check: could not write BENCHMARKS-cuda.md"
import sys
from pathlib import Path
from qrnn.bench.common import machine_info
out = Path(sys.argv[1])
info = machine_info()
parts = [(name, out / f"bench-{key}.md") for name, key in (("ForgetMult kernels", "fm"), ("Layers", "layer"))]
with open(out / "BENCHMARKS-cuda.md", "w") as fh:
    fh.write(f"## CUDA kernels and layers, {info['date']}, {info['gpu']}\n\n")
    fh.write(f"torch {info['torch']}, qrnn {info['qrnn']}; reproduce with `tools/gpu_check.sh` "
             "(or `python -m qrnn.bench cuda`).\n\n")
    for name, path in parts:
        fh.write(f"### {name}\n\n")
        fh.write(path.read_text() if path.is_file() else "(this part failed: see tools/gpu_check.sh's log)\n")
        fh.write("\n")
EOF
fi

# ---- compute-sanitizer --------------------------------------------------------------
sanitizer=$(command -v compute-sanitizer || true)
if [ -z "$sanitizer" ]; then  # beside nvcc, in CUDA_HOME, or where nvcc says its toolkit is
    roots="${CUDA_HOME:-} ${CUDA_PATH:-} /usr/local/cuda"
    if command -v nvcc >/dev/null; then
        roots="$(dirname "$(dirname "$(command -v nvcc)")") $roots"
        roots="$roots $(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/.*TOP=//p' | head -n 1)"
    fi
    for root in $roots; do
        [ -x "$root/bin/compute-sanitizer" ] && { sanitizer="$root/bin/compute-sanitizer"; break; }
        [ -x "$root/compute-sanitizer/compute-sanitizer" ] && { sanitizer="$root/compute-sanitizer/compute-sanitizer"; break; }
    done
fi
sanitize() {  # sanitize TOOL PYTEST_ARGS...: no caching allocator, so an access past a tensor is caught
    local tool=$1
    shift
    [ -n "$sanitizer" ] || { echo "compute-sanitizer not found (not part of this CUDA installation?)"; return 77; }
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 must_pass "$sanitizer" --tool "$tool" --error-exitcode 99 \
        "$PYTHON" -m pytest -q -p no:cacheprovider "$@"
}
export sanitizer
export -f sanitize
run_part memcheck 70 build sanitizer_summary -- sanitize memcheck \
    tests/forget_mult/test_forget_mult_cuda.py -k "(layouts_odd_sizes and float16 and (37 or 38)) or poisoned_allocator"
run_part racecheck 45 build sanitizer_summary -- sanitize racecheck \
    tests/forget_mult/test_forget_mult_cuda.py -k "test_sequence_lengths and chunked and float16"
run_part synccheck 35 build sanitizer_summary -- sanitize synccheck \
    tests/forget_mult/test_forget_mult_cuda.py -k "test_sequence_lengths and chunked and float32"

# ---- results table ------------------------------------------------------------------
failed=0
for state in "${states[@]}"; do case "$state" in FAIL | TIMEOUT) failed=1 ;; esac; done
{
    echo
    echo "== gpu_check results: $gpu, $(($(date +%s) - START))s of a ${BUDGET_S}s budget"
    printf '%-12s %-8s %6s  %s\n' part result time note
    for i in "${!names[@]}"; do
        printf '%-12s %-8s %5ss  %s\n' "${names[$i]}" "${states[$i]}" "${seconds[$i]}" "${notes[$i]}"
    done
    if [ $failed -ne 0 ]; then echo "gpu_check: FAILED (logs under $OUT_DIR)"; else echo "gpu_check: no part failed"; fi
} | tee "$OUT_DIR/summary.txt"
exit $failed
