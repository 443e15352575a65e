// What the kernel tests (ForgetMult, fused gates) share: the start of main(), since ctest
// runs each once per instruction set forced through QRNN_SIMD (generic|avx2|avx512|
// avx512_bf16), and
// the size checks every kernel entry point makes.
#pragma once

#include <qrnn/forget_mult.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include "test_arrays.hpp"
#include "test_check.hpp"

namespace qrnn_test {

inline bool cpu_has(const std::string& isa) {
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
    if (isa == "avx2")
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (isa == "avx512") return avx512;
#if defined(QRNN_TEST_AVX512_BF16_BUILT)
    if (isa == "avx512_bf16") return avx512 && __builtin_cpu_supports("avx512bf16");
#endif
    // (Without those kernels built, a library dispatches avx512_bf16 to avx512: counted as lacking it.)
#endif
#if defined(__aarch64__) && defined(__linux__)
    if (isa == "neon") return (getauxval(AT_HWCAP) & (1 << 1)) != 0;  // HWCAP_ASIMD
#endif
    return isa == "generic";
}

// Checks that the kernels run on the instruction set QRNN_SIMD forces, if any, and on the
// one QRNN_EXPECT_SIMD names, if set (the emulated runs of tools/arm_check.sh prove with it
// which level ran), then seeds rng and names the set and seed. Returns 77 (ctest: skipped)
// only when the CPU really lacks the forced set, else 0.
inline int start_kernel_test(const char* test_name) {
    const char* forced = std::getenv("QRNN_SIMD");
    const std::string want = forced ? forced : "";
    const std::string level = qrnn::cpu::simd_level();
    if (!want.empty() && level != want) {
        if (!cpu_has(want)) {
            std::printf("skipped: QRNN_SIMD=%s but this CPU lacks it (dispatches to %s)\n", want.c_str(),
                        level.c_str());
            return 77;
        }
        CHECK_MSG(false, "QRNN_SIMD=" + want + " was not honoured: the kernels use " + level);
    }
    const char* expect = std::getenv("QRNN_EXPECT_SIMD");
    if (expect && *expect) CHECK_MSG(level == expect, std::string("expected the ") + expect + " kernels, ran " + level);
    const uint64_t seed = std::random_device{}();
    rng.seed(seed);
    std::printf("%s: kernels %s, seed %llu\n", test_name, level.c_str(), (unsigned long long)seed);
    return 0;
}

// Parameters over seq_len x batch x hidden arrays, every other field at its default.
template <typename Params>
Params sized(int64_t seq_len, int64_t batch, int64_t hidden) {
    Params p;
    p.seq_len = seq_len;
    p.batch = batch;
    p.hidden = hidden;
    return p;
}

// make() gives valid parameters that call(p) accepts; a negative size must throw naming it.
template <typename Make, typename Call>
void check_size_arguments(Make make, Call call, int64_t negative_batch) {
    CHECK_NOTHROW(call(make()));
    CHECK_REJECTS(make, call, "seq_len", p.seq_len = -1);
    CHECK_REJECTS(make, call, "batch", p.batch = negative_batch);
    CHECK_REJECTS(make, call, "hidden", p.hidden = std::numeric_limits<int64_t>::min());
}

}  // namespace qrnn_test
