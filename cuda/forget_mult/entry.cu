// CUDA ForgetMult entry points: the shared scan entry (common/scan_plan.hpp: validate like the
// CPU path, choose the launch plan, hand over to the launcher of the dtype's translation unit).
#include "common/scan_plan.hpp"
#include "qrnn/forget_mult_cuda.hpp"

QRNN_CUDA_SCAN_ENTRY_POINTS(forget_mult, ForgetMultForwardParams, ForgetMultBackwardParams)
