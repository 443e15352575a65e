// What the launchers of the scan families on CUDA (qrnn/forget_mult_cuda.hpp,
// qrnn/linear_scan_cuda.hpp) share: the time schedule a call may force, the launch plan a
// call reports, and the launchers' declarations. Declared only in builds with the CUDA
// kernels (QRNN_WITH_CUDA).
#pragma once

#include "qrnn/dtype.hpp"  // QRNN_API

#if defined(QRNN_WITH_CUDA)

namespace qrnn::cuda {

// How the kernels split the work. `serial`: one thread per group of hidden units
// walks the whole sequence, keeping several time steps of loads in flight.
// `chunked`: time is split into chunks handled by different threads of a block
// (a pass over each chunk, carry propagation through shared memory, a replay from
// registers): for long sequences with too few columns to keep the memory busy.
// `automatic` picks by size (cuda/NOTES.md gives the rule); the results agree to
// rounding either way.
enum class Schedule : int { automatic = 0, serial = 1, chunked = 2 };

// What a call will launch: hidden units per thread (vector width of the loads) and
// time chunks per column (1 for the serial schedule).
struct LaunchPlan {
    int vector_width = 1;
    int chunks = 1;
};

}  // namespace qrnn::cuda

// A scan family's launchers, declared in namespace qrnn::cuda by qrnn/<family>_cuda.hpp (in
// builds with the CUDA kernels; nothing otherwise):
//
//   void <family>_forward(const Forward& params, void* stream,
//                         Schedule schedule = Schedule::automatic, int device = -1);
//   void <family>_backward(const Backward& params, void* stream,
//                          Schedule schedule = Schedule::automatic, int device = -1);
//   // The plan a call with these arguments would launch; host-only, touches no device.
//   LaunchPlan <family>_forward_plan(const Forward& params, Schedule schedule = Schedule::automatic);
//   LaunchPlan <family>_backward_plan(const Backward& params, Schedule schedule = Schedule::automatic);
//
// Invalid sizes, strides, dtypes or null pointers throw std::invalid_argument (as the CPU
// path does); a failed launch throws std::runtime_error with CUDA's message.
#define QRNN_CUDA_SCAN_LAUNCHERS(family, Forward, Backward)                                                        \
    namespace qrnn::cuda {                                                                                         \
    QRNN_API void family##_forward(const Forward& params, void* stream, Schedule schedule = Schedule::automatic,   \
                                   int device = -1);                                                               \
    QRNN_API void family##_backward(const Backward& params, void* stream, Schedule schedule = Schedule::automatic, \
                                    int device = -1);                                                              \
    QRNN_API LaunchPlan family##_forward_plan(const Forward& params, Schedule schedule = Schedule::automatic);     \
    QRNN_API LaunchPlan family##_backward_plan(const Backward& params, Schedule schedule = Schedule::automatic);   \
    }

#else
#define QRNN_CUDA_SCAN_LAUNCHERS(family, Forward, Backward)
#endif  // QRNN_WITH_CUDA
