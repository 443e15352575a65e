// Which instruction set the CPU kernels run on here, chosen once per process. Every
// kernel family (ForgetMult, fused QRNN gates) keeps one table per instruction set and
// indexes it by this choice (common/isa_table.hpp), so they always agree.
#pragma once

namespace qrnn::cpu {

enum class Isa { generic, avx2, avx512 };

// The best set this CPU supports; QRNN_SIMD=generic|avx2|avx512 caps it (tests use it
// to cover each path).
Isa selected_isa();

inline const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::avx512: return "avx512";
        case Isa::avx2: return "avx2";
        case Isa::generic: break;
    }
    return "generic";
}

}  // namespace qrnn::cpu
