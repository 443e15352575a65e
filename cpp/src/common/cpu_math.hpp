// Activations for the CPU kernels, written so that the compiler vectorises the loops
// that call them: straight-line float code (selects, no libm calls). float64 uses libm:
// it is the reference precision, not a speed path. Compiled per instruction set inside
// namespace QRNN_ISA, like every kernel helper.
//
// float32: tanh(x) = x P(x^2) / Q(x^2) on |x| <= 9 (beyond, tanh rounds to +-1 in
// float32), P and Q of degree 4 with P(0) = Q(0) = 1 (so tanh(x) = x exactly near 0).
// The coefficients are our own fit (iteratively reweighted least squares on the
// relative error, in float64); evaluated in float32 the error is below 4e-7 over the
// whole line. sigmoid(x) = (1 + tanh(x / 2)) / 2. Q lies in [1, 420], so the
// denominators of the two or three gates of one element share a single division.
// On AVX-512, contiguous float32 and 16-bit rows use the same functions written with
// intrinsics instead (cpu_vec512.hpp, which says why).
#pragma once

#include <cmath>

#ifndef QRNN_ISA
#error "define QRNN_ISA before including common/cpu_math.hpp"
#endif

namespace qrnn::cpu::QRNN_ISA {

struct Ratio { float num, den; };

// tanh(x) = num / den. A NaN x gives a NaN num and a finite den: the gates of an element
// share one division, and a NaN in one gate must not reach the others (the float64 loop
// keeps them apart).
inline Ratio tanh_ratio(float x) {
    const float xc = x < -9.f ? -9.f : (x > 9.f ? 9.f : x);
    const float u = xc * xc;
    const float uq = u == u ? u : 0.f;  // u, or 0 for NaN
    const float p = (((1.34226202e-08f * u + 2.06632813e-05f) * u + 3.49911864e-03f) * u + 1.33840834e-01f) * u + 1.f;
    const float q =
        (((7.80587458e-07f * uq + 3.29123891e-04f) * uq + 2.58906725e-02f) * uq + 4.67174049e-01f) * uq + 1.f;
    return {xc * p, q};
}

// The fit overshoots 1 by up to 2e-7: clamp so that a gate never leaves [0, 1].
inline float clamp_unit(float t) { return t < -1.f ? -1.f : (t > 1.f ? 1.f : t); }
inline float sigmoid_from_tanh(float t) { return 0.5f * t + 0.5f; }

// tanh(a), sigmoid(b), sigmoid(c) with one division.
inline void tanh_sigmoid_sigmoid(float a, float b, float c, float& ta, float& sb, float& sc) {
    const Ratio ra = tanh_ratio(a), rb = tanh_ratio(0.5f * b), rc = tanh_ratio(0.5f * c);
    const float dab = ra.den * rb.den;
    const float r = 1.f / (dab * rc.den);
    const float r_c = r * rc.den;
    ta = clamp_unit(ra.num * (r_c * rb.den));
    sb = sigmoid_from_tanh(clamp_unit(rb.num * (r_c * ra.den)));
    sc = sigmoid_from_tanh(clamp_unit(rc.num * (r * dab)));
}

// tanh(a), sigmoid(b) with one division.
inline void tanh_sigmoid(float a, float b, float& ta, float& sb) {
    const Ratio ra = tanh_ratio(a), rb = tanh_ratio(0.5f * b);
    const float r = 1.f / (ra.den * rb.den);
    ta = clamp_unit(ra.num * (r * rb.den));
    sb = sigmoid_from_tanh(clamp_unit(rb.num * (r * ra.den)));
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

inline void tanh_sigmoid_sigmoid(double a, double b, double c, double& ta, double& sb, double& sc) {
    ta = std::tanh(a);
    sb = sigmoid(b);
    sc = sigmoid(c);
}

inline void tanh_sigmoid(double a, double b, double& ta, double& sb) {
    ta = std::tanh(a);
    sb = sigmoid(b);
}

}  // namespace qrnn::cpu::QRNN_ISA
