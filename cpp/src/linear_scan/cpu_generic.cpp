// linear_scan kernels compiled for one instruction set (generic); flags come from CMake.
#define QRNN_ISA generic
#include "linear_scan/kernels.hpp"
