// One table of fused QRNN gate kernels per instruction set, indexed by DType.
#pragma once

#include <algorithm>
#include <cstdint>

#include "qrnn/qrnn_gates.hpp"

namespace qrnn::cpu {

// Hidden units per work item: an item's float32 state, gradient and stand-in rows
// (a few KB) stay in L1 while it walks time.
constexpr int64_t gates_max_block = 512;

// Equal blocks of at most gates_max_block units, a multiple of 16 (one AVX-512
// register of floats), so that H = 1550 gives 4 items of 400 per batch row rather
// than three of 512 and one of 14.
inline int64_t gates_block(int64_t hidden) {
    const int64_t n_blocks = std::max<int64_t>(1, (hidden + gates_max_block - 1) / gates_max_block);
    const int64_t even = (hidden + n_blocks - 1) / n_blocks;
    return std::min(gates_max_block, (even + 15) / 16 * 16);
}

using GatesForwardKernel = void (*)(const QrnnGatesForwardParams&, int64_t begin, int64_t end);
using GatesBackwardKernel = void (*)(const QrnnGatesBackwardParams&, int64_t begin, int64_t end);

struct GatesKernelTable {
    GatesForwardKernel forward[4];  // by int(DType)
    GatesBackwardKernel backward[4];
};

namespace generic { extern const GatesKernelTable gates_table; }
#if defined(QRNN_HAVE_X86_KERNELS)
namespace avx2 { extern const GatesKernelTable gates_table; }
namespace avx512 { extern const GatesKernelTable gates_table; }
#endif

}  // namespace qrnn::cpu
