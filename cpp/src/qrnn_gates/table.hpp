// One table of fused QRNN gate kernels per instruction set, indexed by DType.
#pragma once

#include <cstdint>

#include "common/cpu_work_items.hpp"
#include "qrnn/qrnn_gates.hpp"

namespace qrnn::cpu {

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
