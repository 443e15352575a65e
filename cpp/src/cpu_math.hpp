// Activations for the CPU kernels, written so that the compiler vectorises the loops
// that call them: straight-line float code (selects, no calls to libm), Cephes-style
// range reduction and polynomials, accurate to a few float32 ulp. float64 uses libm:
// it is the reference precision, not a speed path. Compiled per instruction set
// inside namespace QRNN_ISA, like every kernel helper.
#pragma once

#include <cmath>
#include <cstdint>

#include "qrnn/dtype.hpp"

#ifndef QRNN_ISA
#error "define QRNN_ISA before including cpu_math.hpp"
#endif

namespace qrnn::cpu::QRNN_ISA {

// e^x for |x| <= 80 (inputs beyond are clamped: every use below saturates long before,
// and the clamp keeps results normal, away from slow subnormals). NaN stays NaN.
inline float exp_clamped(float x) {
    const float xc = x < -80.f ? -80.f : (x > 80.f ? 80.f : x);
    // n = round(x / ln 2) by the 1.5 * 2^23 trick; its low bits are n as an integer.
    const float magic = 12582912.f;
    const float shifted = xc * 1.44269504088896341f + magic;
    const float n = shifted - magic;
    const int32_t ni = int32_t(float_to_bits(shifted)) - int32_t(float_to_bits(magic));
    float r = xc - n * 0.693359375f;  // ln 2 split in two for an exact reduction
    r = r - n * -2.12194440e-4f;
    const float y = (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
                       4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f) * (r * r) + r + 1.f;
    const float scaled = bits_to_float(float_to_bits(y) + (uint32_t(ni) << 23));  // y * 2^n
    return x != x ? x : scaled;
}

inline float sigmoid(float x) { return 1.f / (1.f + exp_clamped(-x)); }

inline float tanh(float x) {
    const uint32_t sign = float_to_bits(x) & 0x80000000u;
    const float a = bits_to_float(float_to_bits(x) & 0x7fffffffu);
    // |x| < 0.625: odd polynomial (no cancellation near 0); above: 1 - 2 / (e^2|x| + 1).
    const float z = x * x;
    const float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                          1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
    const float large_abs = 1.f - 2.f / (exp_clamped(2.f * a) + 1.f);
    const float large = bits_to_float(float_to_bits(large_abs) | sign);
    return a < 0.625f ? small : large;
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double tanh(double x) { return std::tanh(x); }

}  // namespace qrnn::cpu::QRNN_ISA
