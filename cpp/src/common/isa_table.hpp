// The per-instruction-set tables of CPU kernels, one shape for every kernel family
// (ForgetMult, fused QRNN gates). A family's kernels.hpp is compiled once per instruction
// set (<family>/cpu_<isa>.cpp defines QRNN_ISA), each time inside namespace QRNN_ISA, and
// specialises Kernels there; its entry point (<family>/cpu.cpp) calls selected_table.
#pragma once

#include <cstdint>

#include "common/cpu_isa.hpp"

namespace qrnn::cpu {

// A family's entry points for one instruction set, indexed by int(DType).
template <typename ForwardParams, typename BackwardParams>
struct KernelTable {
    using Forward = void (*)(const ForwardParams&, int64_t begin, int64_t end);
    using Backward = void (*)(const BackwardParams&, int64_t begin, int64_t end);
    Forward forward[4];
    Backward backward[4];
    // What the contiguous rows run on: the vector layer's name (common/cpu_vec.hpp), or
    // "generic" for the plain loops the compiler vectorises as it can.
    const char* rows;
};

// Each instruction set's table of a family, instantiated by the family's cpu_<isa>.cpp.
namespace generic {
template <typename ForwardParams, typename BackwardParams>
const KernelTable<ForwardParams, BackwardParams>& kernel_table();
}
#if defined(QRNN_HAVE_X86_KERNELS)
namespace avx2 {
template <typename ForwardParams, typename BackwardParams>
const KernelTable<ForwardParams, BackwardParams>& kernel_table();
}
namespace avx512 {
template <typename ForwardParams, typename BackwardParams>
const KernelTable<ForwardParams, BackwardParams>& kernel_table();
}
namespace avx512_bf16 {
template <typename ForwardParams, typename BackwardParams>
const KernelTable<ForwardParams, BackwardParams>& kernel_table();
}
#endif
#if defined(QRNN_HAVE_NEON_KERNELS)
namespace neon {
template <typename ForwardParams, typename BackwardParams>
const KernelTable<ForwardParams, BackwardParams>& kernel_table();
}
#endif

// Whether a family compiles its kernels for avx512_bf16 as well (it specialises this to
// true before its first selected_table call); the others run their avx512 kernels there.
template <typename ForwardParams, typename BackwardParams>
constexpr bool has_avx512_bf16_kernels = false;

// The family's table for the instruction set selected_isa() picks, looked up once.
template <typename ForwardParams, typename BackwardParams>
const KernelTable<ForwardParams, BackwardParams>& selected_table() {
    using Table = KernelTable<ForwardParams, BackwardParams>;
    static const Table& table = []() -> const Table& {
        switch (selected_isa()) {
#if defined(QRNN_HAVE_X86_KERNELS)
            case Isa::avx512_bf16:
#if defined(QRNN_HAVE_AVX512_BF16_KERNELS)
                if constexpr (has_avx512_bf16_kernels<ForwardParams, BackwardParams>)
                    return avx512_bf16::kernel_table<ForwardParams, BackwardParams>();
#endif
                return avx512::kernel_table<ForwardParams, BackwardParams>();
            case Isa::avx512: return avx512::kernel_table<ForwardParams, BackwardParams>();
            case Isa::avx2: return avx2::kernel_table<ForwardParams, BackwardParams>();
#endif
#if defined(QRNN_HAVE_NEON_KERNELS)
            case Isa::neon: return neon::kernel_table<ForwardParams, BackwardParams>();
#endif
            default: break;
        }
        return generic::kernel_table<ForwardParams, BackwardParams>();
    }();
    return table;
}

}  // namespace qrnn::cpu

#if defined(QRNN_ISA)
#include "qrnn/dtype.hpp"

namespace qrnn::cpu::QRNN_ISA {

// A family's kernels in this instruction set: the family specialises it with static
// forward<T> and backward<T>, T the storage type, and `rows` (KernelTable::rows).
template <typename ForwardParams, typename BackwardParams>
struct Kernels;

template <typename ForwardParams, typename BackwardParams>
const KernelTable<ForwardParams, BackwardParams>& kernel_table() {
    using K = Kernels<ForwardParams, BackwardParams>;
    static constexpr KernelTable<ForwardParams, BackwardParams> table = {
        {&K::template forward<float>, &K::template forward<double>, &K::template forward<bfloat16>,
         &K::template forward<float16>},
        {&K::template backward<float>, &K::template backward<double>, &K::template backward<bfloat16>,
         &K::template backward<float16>},
        K::rows,
    };
    return table;
}

}  // namespace qrnn::cpu::QRNN_ISA
#endif
