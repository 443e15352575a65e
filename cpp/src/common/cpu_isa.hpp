// Which instruction set the CPU kernels run on here, chosen once per process. Every
// kernel family (ForgetMult, fused QRNN gates) keeps one table per instruction set and
// indexes it by this choice (common/isa_table.hpp), so they always agree.
#pragma once

namespace qrnn::cpu {

// avx512_bf16: AVX-512 plus its bfloat16 conversion instructions; families without kernels
// of their own for it run their avx512 ones (isa_table.hpp).
enum class Isa { generic, avx2, avx512, avx512_bf16 };

// The best set this CPU supports; QRNN_SIMD=generic|avx2|avx512|avx512_bf16 caps it (tests
// use it to cover each path).
Isa selected_isa();

inline const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::avx512_bf16: return "avx512_bf16";
        case Isa::avx512: return "avx512";
        case Isa::avx2: return "avx2";
        case Isa::generic: break;
    }
    return "generic";
}

}  // namespace qrnn::cpu
