#include "common/cpu_isa.hpp"

#include "qrnn/forget_mult.hpp"

#include <cstdlib>
#include <string>

#if defined(QRNN_HAVE_NEON_KERNELS)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#endif

namespace qrnn::cpu {
namespace {

Isa detect() {
    const char* forced = std::getenv("QRNN_SIMD");
    const std::string want = forced ? forced : "";
#if defined(QRNN_HAVE_X86_KERNELS)
    __builtin_cpu_init();
    const bool has_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    const bool has_avx2 =
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#if defined(QRNN_HAVE_AVX512_BF16_KERNELS)
    const bool has_avx512_bf16 = has_avx512 && __builtin_cpu_supports("avx512bf16");
#else
    const bool has_avx512_bf16 = false;  // the compiler could not build those kernels
#endif
    // Each level also serves a cap above it that this CPU (or build) lacks.
    if (has_avx512_bf16 && (want.empty() || want == "avx512_bf16")) return Isa::avx512_bf16;
    if (has_avx512 && (want.empty() || want == "avx512_bf16" || want == "avx512")) return Isa::avx512;
    if (has_avx2 && (want.empty() || want == "avx512_bf16" || want == "avx512" || want == "avx2")) return Isa::avx2;
#endif
#if defined(QRNN_HAVE_NEON_KERNELS)
    // Every AArch64 Linux CPU has Advanced SIMD, but the kernel says so: ask rather than assume.
    const bool has_neon = (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
    if (has_neon && (want.empty() || want == "neon")) return Isa::neon;
#endif
    (void)want;
    return Isa::generic;
}

}  // namespace

const char* simd_rows(const char* family) {
    const std::string name = family ? family : "";
#define QRNN_ROWS_OF(f) \
    if (name == #f) return f##_rows();
    QRNN_FAMILY_NAMES(QRNN_ROWS_OF)
#undef QRNN_ROWS_OF
    return nullptr;
}

Isa selected_isa() {
    static const Isa isa = detect();
    return isa;
}

}  // namespace qrnn::cpu
