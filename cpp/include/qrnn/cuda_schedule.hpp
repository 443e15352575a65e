// What the launchers of the scan families on CUDA (qrnn/forget_mult_cuda.hpp,
// qrnn/linear_scan_cuda.hpp) share: the time schedule a call may force and the launch plan
// a call reports. Declared only in builds with the CUDA kernels (QRNN_WITH_CUDA).
#pragma once

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

#endif  // QRNN_WITH_CUDA
