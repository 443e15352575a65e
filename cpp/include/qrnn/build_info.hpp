// What this build of the qrnn core library contains.
#pragma once

#include "qrnn/dtype.hpp"
#include "qrnn/forget_mult.hpp"

namespace qrnn {

struct BuildInfo {
    const char* version;
    const char* compiler;
    const char* build_type;
    bool cuda;                       // CUDA kernels compiled in
    const char* cuda_architectures;  // e.g. "75-real 80-real 86-real 89-real 90"
    const char* simd;                // instruction set the CPU kernels use here
};

QRNN_API BuildInfo build_info();

}  // namespace qrnn
