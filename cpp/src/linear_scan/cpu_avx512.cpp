// linear_scan kernels compiled for one instruction set (avx512); flags come from CMake.
#define QRNN_ISA avx512
#include "linear_scan/kernels.hpp"
