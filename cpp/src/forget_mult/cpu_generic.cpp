// ForgetMult kernels compiled for one instruction set (generic); flags come from CMake.
#define QRNN_ISA generic
#include "forget_mult/kernels.hpp"
