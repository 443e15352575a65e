// Fused QRNN gate kernels compiled for one instruction set (generic); flags come from CMake.
#define QRNN_ISA generic
#include "qrnn_gates/kernels.hpp"
