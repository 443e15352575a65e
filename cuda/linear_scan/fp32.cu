// linear_scan CUDA launchers for float32 storage: one translation unit per dtype, so the
// kernels of different dtypes compile in parallel.
#include "common/launch.cuh"
#include "linear_scan/kernels.cuh"

QRNN_DEFINE_CUDA_LAUNCHERS(qrnn::DType::float32, LinearScanKernels)
