// Fused QRNN gate kernels compiled for one instruction set (neon, AArch64
// only): the NEON rows of the vector layer
// (common/cpu_vec128_neon.hpp); flags come from CMake.
#define QRNN_ISA neon
#define QRNN_ISA_NEON 1
#include "qrnn_gates/kernels.hpp"
