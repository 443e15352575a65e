// Instantiates the kernels of qrnn_gates/kernels.hpp for every storage type, as the
// table of entry points for one instruction set (QRNN_ISA).
#pragma once

#include "qrnn_gates/kernels.hpp"
#include "qrnn_gates/table.hpp"

namespace qrnn::cpu::QRNN_ISA {

extern const GatesKernelTable gates_table = {
    {&gates_forward<float>, &gates_forward<double>, &gates_forward<bfloat16>, &gates_forward<float16>},
    {&gates_backward<float>, &gates_backward<double>, &gates_backward<bfloat16>, &gates_backward<float16>},
};

}  // namespace qrnn::cpu::QRNN_ISA
