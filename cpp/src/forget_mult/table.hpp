// One table of ForgetMult kernels per instruction set, indexed by DType.
#pragma once

#include <cstdint>

#include "common/cpu_work_items.hpp"
#include "qrnn/forget_mult.hpp"

namespace qrnn::cpu {

using ForwardKernel = void (*)(const ForgetMultForwardParams&, int64_t begin, int64_t end);
using BackwardKernel = void (*)(const ForgetMultBackwardParams&, int64_t begin, int64_t end);

struct KernelTable {
    ForwardKernel forward[4];    // by int(DType)
    BackwardKernel backward[4];
};

namespace generic { extern const KernelTable table; }
#if defined(QRNN_HAVE_X86_KERNELS)
namespace avx2 { extern const KernelTable table; }
namespace avx512 { extern const KernelTable table; }
#endif

}  // namespace qrnn::cpu
