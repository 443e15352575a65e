// linear_scan kernels compiled for one instruction set (avx2); flags come from CMake.
#define QRNN_ISA avx2
#include "linear_scan/kernels.hpp"
