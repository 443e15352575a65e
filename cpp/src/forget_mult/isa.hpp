// Instantiates the kernels of forget_mult/kernels.hpp for every storage type, as the
// table of entry points for one instruction set (QRNN_ISA).
#pragma once

#include "forget_mult/kernels.hpp"
#include "forget_mult/table.hpp"

namespace qrnn::cpu::QRNN_ISA {

extern const KernelTable table = {
    {&forward<float>, &forward<double>, &forward<bfloat16>, &forward<float16>},
    {&backward<float>, &backward<double>, &backward<bfloat16>, &backward<float16>},
};

}  // namespace qrnn::cpu::QRNN_ISA
