// qrnn._C's CUDA launchers (qrnn.ops.core.cuda and each family's kernels.py), built when the library has them. They
// take the CPU entry points' numbers with the stream (a cudaStream_t as an integer, read by Python on every call), the
// schedule (the scan families) and the device index in place of num_threads. A launch only queues work, so the GIL
// stays held.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "bindings.hpp"
#include "qrnn/forget_mult_cuda.hpp"
#include "qrnn/linear_scan_cuda.hpp"
#include "qrnn/qrnn_gates_cuda.hpp"

namespace qrnn::bindings {
namespace {

namespace cuda = qrnn::cuda;

cuda::Schedule schedule_of(int64_t code) {
    if (code < 0 || code > 2) throw std::invalid_argument("schedule must be 0..2, got " + std::to_string(code));
    return static_cast<cuda::Schedule>(code);
}

void* stream_of(int64_t handle) { return reinterpret_cast<void*>(static_cast<uintptr_t>(handle)); }

// The scan families (common/scan.cuh), one line each: S(family), whose launchers are
// qrnn::cuda::<family>_forward / _backward and plans <family>_forward_plan / _backward_plan.
#define QRNN_CUDA_SCAN_FAMILIES(S) \
    S(forget_mult)                 \
    S(linear_scan)

// A scan family's four entries: cuda_<family>_forward / _backward(<fields>, stream, schedule,
// device) and the host-only cuda_<family>_forward_plan / _backward_plan(<fields>, schedule).
#define QRNN_CUDA_SCAN_ENTRIES(family)                                                                         \
    QRNN_FAST_ENTRY(                                                                                           \
        cuda_##family##_forward, family##_forward, 3, false,                                                   \
        "cuda_" #family "_forward(<" #family                                                                   \
        "_forward's fields>, stream, schedule, device): launch "                                               \
        "on stream (a cudaStream_t) of device (made current for the launch); schedule: a code of "             \
        "cuda_schedules()",                                                                                    \
        cuda::family##_forward(p, stream_of(call.extra(0)), schedule_of(call.extra(1)), int(call.extra(2))))   \
    QRNN_FAST_ENTRY(                                                                                           \
        cuda_##family##_backward, family##_backward, 3, false,                                                 \
        "cuda_" #family "_backward(<" #family "_backward's fields>, stream, schedule, device)",                \
        cuda::family##_backward(p, stream_of(call.extra(0)), schedule_of(call.extra(1)), int(call.extra(2))))  \
    /* Host-only: what a launch would use, for tests and the emulator. */                                      \
    QRNN_FAST_ENTRY(cuda_##family##_forward_plan, family##_forward, 1, false,                                  \
                    "cuda_" #family "_forward_plan(<fields>, schedule) -> (vector_width, chunks), host-only",  \
                    return cuda::family##_forward_plan(p, schedule_of(call.extra(0))))                         \
    QRNN_FAST_ENTRY(cuda_##family##_backward_plan, family##_backward, 1, false,                                \
                    "cuda_" #family "_backward_plan(<fields>, schedule) -> (vector_width, chunks), host-only", \
                    return cuda::family##_backward_plan(p, schedule_of(call.extra(0))))
#define QRNN_CUDA_SCAN_ENTRY_NAMES(family) \
    cuda_##family##_forward, cuda_##family##_backward, cuda_##family##_forward_plan, cuda_##family##_backward_plan,

QRNN_CUDA_SCAN_FAMILIES(QRNN_CUDA_SCAN_ENTRIES)
QRNN_FAST_ENTRY(cuda_qrnn_gates_forward, qrnn_gates_forward, 2, false,
                "cuda_qrnn_gates_forward(<qrnn_gates_forward's fields>, stream, device): lengths in device memory",
                cuda::qrnn_gates_forward(p, stream_of(call.extra(0)), int(call.extra(1))))
QRNN_FAST_ENTRY(cuda_qrnn_gates_backward, qrnn_gates_backward, 2, false,
                "cuda_qrnn_gates_backward(<qrnn_gates_backward's fields>, stream, device)",
                cuda::qrnn_gates_backward(p, stream_of(call.extra(0)), int(call.extra(1))))
// Host-only: what a launch would use, for tests and the emulator.
QRNN_FAST_ENTRY(cuda_qrnn_gates_forward_width, qrnn_gates_forward, 0, false,
                "cuda_qrnn_gates_forward_width(<fields>) -> (vector_width, 1), host-only",
                return cuda::LaunchPlan{cuda::qrnn_gates_forward_vector_width(p), 1})
QRNN_FAST_ENTRY(cuda_qrnn_gates_backward_width, qrnn_gates_backward, 0, false,
                "cuda_qrnn_gates_backward_width(<fields>) -> (vector_width, 1), host-only",
                return cuda::LaunchPlan{cuda::qrnn_gates_backward_vector_width(p), 1})

}  // namespace

void bind_cuda(py::module_& m) {
    def_fast<QRNN_CUDA_SCAN_FAMILIES(QRNN_CUDA_SCAN_ENTRY_NAMES) cuda_qrnn_gates_forward, cuda_qrnn_gates_backward,
             cuda_qrnn_gates_forward_width, cuda_qrnn_gates_backward_width>(m);
    m.def(
        "cuda_schedules",
        [] {
            py::dict d;
            d["auto"] = int(cuda::Schedule::automatic);
            d["serial"] = int(cuda::Schedule::serial);
            d["chunked"] = int(cuda::Schedule::chunked);
            return d;
        },
        "{name: code} of qrnn::cuda::Schedule, the schedule argument of the scan families' launchers");
}

}  // namespace qrnn::bindings
