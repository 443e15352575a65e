// Fused QRNN gate kernels compiled for one instruction set (avx512_bf16); flags come from CMake.
#define QRNN_ISA avx512_bf16
#include "qrnn_gates/kernels.hpp"
