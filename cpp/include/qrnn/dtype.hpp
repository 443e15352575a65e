// Element types the kernels store, and the conversions to and from the float32
// in which every kernel does its math and carries its state.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(_WIN32)
#define QRNN_API __declspec(dllexport)
#else
#define QRNN_API __attribute__((visibility("default")))
#endif

namespace qrnn {

enum class DType : int { float32 = 0, float64 = 1, bfloat16 = 2, float16 = 3 };

// Storage-only 16-bit types: plain bit patterns, no arithmetic on purpose.
struct bfloat16 { uint16_t bits; };
struct float16 { uint16_t bits; };

inline const char* dtype_name(DType d) {
    switch (d) {
        case DType::float32: return "float32";
        case DType::float64: return "float64";
        case DType::bfloat16: return "bfloat16";
        case DType::float16: return "float16";
    }
    return "unknown";
}

inline int64_t dtype_size(DType d) { return (d == DType::float64) ? 8 : (d == DType::float32) ? 4 : 2; }

// The carried-state rule, the one place C++ states it (python/qrnn/ops/core/kernel_args.py
// states it for Python; tests/torch_library/test_dtype_rules.py checks they agree): a carried
// state a kernel writes (the gates' c_n) is float32 next to 16-bit data, the data's dtype
// otherwise, and a state passed in (h0, c0) may have either dtype.
constexpr bool is_sixteen_bit(DType d) { return d == DType::bfloat16 || d == DType::float16; }
constexpr DType state_dtype(DType data) { return is_sixteen_bit(data) ? DType::float32 : data; }
constexpr bool accepts_state_dtype(DType data, DType state) { return state == data || state == state_dtype(data); }

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::float64; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::bfloat16; };
template <> struct dtype_of<float16> { static constexpr DType value = DType::float16; };

// Math type for a storage type: double stays double, everything else is float.
template <typename T> struct math_type { using type = float; };
template <> struct math_type<double> { using type = double; };

// The conversions below are compiled into every per-instruction-set kernel file. Each of
// those files defines QRNN_ISA first, which gives its copies their own (inline) namespace:
// otherwise the linker could merge an out-of-line AVX-512 copy into the generic path.
#if defined(QRNN_ISA)
inline namespace QRNN_ISA {
#else
inline namespace portable {
#endif

inline float bits_to_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint32_t float_to_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline float to_float(float v) { return v; }
inline double to_float(double v) { return v; }
inline float to_float(bfloat16 v) { return bits_to_float(uint32_t(v.bits) << 16); }

// IEEE half -> float, exact, branch-light so loops over it vectorise.
inline float to_float(float16 v) {
    const uint32_t h = v.bits;
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t exp_mant = h & 0x7fffu;
    // Scale the 15-bit magnitude into float position, then fix the exponent bias by a
    // multiply (handles subnormals for free); Inf/NaN keep an all-ones exponent.
    const float magic = bits_to_float((254u - 15u) << 23);  // 2^112
    float mag = bits_to_float(exp_mant << 13) * magic;
    if (exp_mant >= 0x7c00u) mag = bits_to_float((exp_mant << 13) | 0x7f800000u);
    return bits_to_float(float_to_bits(mag) | sign);
}

template <typename T> inline T from_float(float v);
template <> inline float from_float<float>(float v) { return v; }
template <> inline double from_float<double>(float v) { return v; }

// float -> bfloat16 with round-to-nearest-even; NaN stays a (quiet) NaN.
// Branch-free (a select), so that loops storing bfloat16 vectorise.
template <> inline bfloat16 from_float<bfloat16>(float v) {
    const uint32_t u = float_to_bits(v);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x40u;
    return bfloat16{uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}

// float -> IEEE half with round-to-nearest-even, overflow to Inf, subnormals kept.
template <> inline float16 from_float<float16>(float v) {
    uint32_t u = float_to_bits(v);
    const uint32_t sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    uint16_t out;
    if (u > 0x7f800000u) {
        out = uint16_t(0x7e00u);  // NaN
    } else if (u >= 0x477ff000u) {
        out = uint16_t(0x7c00u);  // rounds to >= 65520: Inf
    } else if (u < 0x38800000u) {
        // Subnormal half (or zero): let the FPU round by adding 0.5 (2^-1 puts the
        // half subnormal grid on the float mantissa's last bits).
        const float f = bits_to_float(u) + 0.5f;
        out = uint16_t(float_to_bits(f) - float_to_bits(0.5f));
    } else {
        const uint32_t mant_odd = (u >> 13) & 1u;
        u += (uint32_t(15 - 127) << 23) + 0xfffu + mant_odd;
        out = uint16_t(u >> 13);
    }
    return float16{uint16_t(out | sign)};
}

inline double to_math(double v) { return v; }
template <typename T> inline float to_math(T v) { return to_float(v); }

}  // inline namespace QRNN_ISA / portable
}  // namespace qrnn
