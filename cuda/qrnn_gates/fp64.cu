// Fused QRNN gate launchers for float64 storage: one translation unit per dtype, so the
// kernels of different dtypes compile in parallel.
#include "qrnn_gates/launch.cuh"

QRNN_DEFINE_CUDA_GATES_LAUNCHERS(qrnn::DType::float64, double)
