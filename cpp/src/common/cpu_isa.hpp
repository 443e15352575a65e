// Which instruction set the CPU kernels run on here, chosen once per process. Every
// kernel family (ForgetMult, fused QRNN gates) keeps one table per instruction set and
// indexes it by this choice (common/isa_table.hpp), so they always agree.
#pragma once

#include "qrnn/families.hpp"

namespace qrnn::cpu {

// avx512_bf16: AVX-512 plus its bfloat16 conversion instructions; families without kernels
// of their own for it run their avx512 ones (isa_table.hpp).
// neon: AArch64's Advanced SIMD, found at run time through getauxval(AT_HWCAP).
enum class Isa { generic, avx2, avx512, avx512_bf16, neon };

// The best set this CPU supports; QRNN_SIMD=generic|avx2|avx512|avx512_bf16 (x86) or
// QRNN_SIMD=generic|neon (AArch64) caps it (tests use it to cover each path).
Isa selected_isa();

// Each family's KernelTable::rows at the selected set, <family>_rows(), defined by the
// family's cpu.cpp.
#define QRNN_DECLARE_ROWS(family) const char* family##_rows();
QRNN_FAMILY_NAMES(QRNN_DECLARE_ROWS)
#undef QRNN_DECLARE_ROWS

inline const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::avx512_bf16: return "avx512_bf16";
        case Isa::avx512: return "avx512";
        case Isa::avx2: return "avx2";
        case Isa::neon: return "neon";
        case Isa::generic: break;
    }
    return "generic";
}

}  // namespace qrnn::cpu
