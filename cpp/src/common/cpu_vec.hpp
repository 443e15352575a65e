// The CPU kernels' vector layer: one of three instruction-set headers, all with the same
// functions (namespace QRNN_ISA::vec: V, Mask, kLanes, kName, lanes, splat, load<T>,
// store<T>, add, sub, mul, fmadd, fnmadd, min, max, zero_if_nan, reciprocal, prefetch), and the gate
// activations written once over them. Each family's contiguous rows are written once over
// this layer and instantiated per instruction set by its cpu_<isa>.cpp:
//   cpu_vec512.hpp       AVX-512 (16 lanes, masked tails)       where built with __AVX512F__
//   cpu_vec256.hpp       AVX2 + FMA + F16C (8 lanes)            where built with those, not AVX-512
//   cpu_vec128_neon.hpp  AArch64 NEON (4 lanes)                 the neon translation units
// Elsewhere (the generic builds) kHaveVec is false and the families keep their plain loops,
// which the compiler vectorises as it can.
//
// The activations are cpu_math.hpp's, same coefficients and error bounds: tanh(x) =
// x P(x^2) / Q(x^2) on |x| <= 9 with clamps as one min and one max, the sigmoids' halving
// folded into their coefficients (powers of two, so bit for bit tanh_ratio(0.5f * x)), and
// the two or three gates of an element sharing one reciprocal.
#pragma once

#include <cstdint>
#include <type_traits>

#ifndef QRNN_ISA
#error "define QRNN_ISA before including common/cpu_vec.hpp"
#endif

#if defined(__AVX512F__)
#include "common/cpu_vec512.hpp"
#define QRNN_HAVE_VEC 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "common/cpu_vec256.hpp"
#define QRNN_HAVE_VEC 1
#elif defined(QRNN_ISA_NEON) && defined(__aarch64__)
#include "common/cpu_vec128_neon.hpp"
#define QRNN_HAVE_VEC 1
#endif

namespace qrnn::cpu::QRNN_ISA {

#if defined(QRNN_HAVE_VEC)
#define QRNN_VEC_BODY __attribute__((always_inline))
constexpr bool kHaveVec = true;
// What a family's contiguous rows run on in this instruction set (`python -m qrnn` prints it).
constexpr const char* kRowsName = vec::kName;

namespace vec {

// The loop every family's rows share: body(j, lanes) for each vector of a row of n
// elements, the last one masked to what is left. The whole vectors come first with the
// full mask as a constant, so their loads and stores have no tail test left in them. The
// body is a lambda marked QRNN_VEC_BODY: called twice, GCC would otherwise keep a large
// one out of line and call it once per vector.
template <typename Body>
QRNN_VEC_INLINE void for_each_vector(int64_t n, Body body) {
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) body(j, lanes(kLanes));
    if (j < n) body(j, lanes(n - j));
}

// ---- Activations -------------------------------------------------------------------------

struct Ratio { V num, den; };

// x P(x^2) and Q(x^2) for x clamped to [-limit, limit], P and Q of degree 4 given by their
// coefficients from the highest. max(-limit, x) keeps a NaN x in P, and Q takes 0 for its
// x^2: an element's gates share one reciprocal, and a NaN in one gate must not reach the
// others (the float64 loop keeps them apart).
QRNN_VEC_INLINE Ratio rational(V x, float limit, const float (&p_coef)[5], const float (&q_coef)[5]) {
    const V xc = min(splat(limit), max(splat(-limit), x));
    const V u = mul(xc, xc);
    const V uq = zero_if_nan(u);
    V p = fmadd(splat(p_coef[0]), u, splat(p_coef[1]));
    V q = fmadd(splat(q_coef[0]), uq, splat(q_coef[1]));
    for (int k = 2; k < 5; ++k) {
        p = fmadd(p, u, splat(p_coef[k]));
        q = fmadd(q, uq, splat(q_coef[k]));
    }
    return {mul(xc, p), q};
}

// The coefficients of cpu_math.hpp's tanh_ratio.
constexpr float kTanhP[5] = {1.34226202e-08f, 2.06632813e-05f, 3.49911864e-03f, 1.33840834e-01f, 1.f};
constexpr float kTanhQ[5] = {7.80587458e-07f, 3.29123891e-04f, 2.58906725e-02f, 4.67174049e-01f, 1.f};
// tanh(x / 2) with the halving folded into the coefficients: P's scaled by 0.5 * 0.25^k and
// Q's by 0.25^k for the term in u^k, all powers of two, so the result is bit for bit
// tanh_ratio(0.5f * x) with two multiplies fewer per sigmoid.
constexpr float kHalfTanhP[5] = {1.34226202e-08f / 512, 2.06632813e-05f / 128, 3.49911864e-03f / 32,
                                 1.33840834e-01f / 8, 0.5f};
constexpr float kHalfTanhQ[5] = {7.80587458e-07f / 256, 3.29123891e-04f / 64, 2.58906725e-02f / 16, 4.67174049e-01f / 4,
                                 1.f};

// tanh(x) = num / den.
QRNN_VEC_INLINE Ratio tanh_ratio(V x) { return rational(x, 9.f, kTanhP, kTanhQ); }
// tanh(x / 2) = num / den, for the sigmoids.
QRNN_VEC_INLINE Ratio half_tanh_ratio(V x) { return rational(x, 18.f, kHalfTanhP, kHalfTanhQ); }

QRNN_VEC_INLINE V clamp_unit(V t) { return min(splat(1.f), max(splat(-1.f), t)); }
QRNN_VEC_INLINE V sigmoid_from_tanh(V t) { return fmadd(splat(0.5f), t, splat(0.5f)); }

// tanh(a), sigmoid(b), sigmoid(c) with one reciprocal.
QRNN_VEC_INLINE void tanh_sigmoid_sigmoid(V a, V b, V c, V& ta, V& sb, V& sc) {
    const Ratio ra = tanh_ratio(a), rb = half_tanh_ratio(b), rc = half_tanh_ratio(c);
    const V dab = mul(ra.den, rb.den);
    const V r = reciprocal(mul(dab, rc.den));
    const V r_c = mul(r, rc.den);
    ta = clamp_unit(mul(ra.num, mul(r_c, rb.den)));
    sb = sigmoid_from_tanh(clamp_unit(mul(rb.num, mul(r_c, ra.den))));
    sc = sigmoid_from_tanh(clamp_unit(mul(rc.num, mul(r, dab))));
}

// tanh(a), sigmoid(b) with one reciprocal.
QRNN_VEC_INLINE void tanh_sigmoid(V a, V b, V& ta, V& sb) {
    const Ratio ra = tanh_ratio(a), rb = half_tanh_ratio(b);
    const V r = reciprocal(mul(ra.den, rb.den));
    ta = clamp_unit(mul(ra.num, mul(r, rb.den)));
    sb = sigmoid_from_tanh(clamp_unit(mul(rb.num, mul(r, ra.den))));
}

}  // namespace vec
#else
constexpr bool kHaveVec = false;
constexpr const char* kRowsName = "generic";
#endif

// Whether storage type T's contiguous rows take the vector layer here (float64 never does:
// it is the reference precision, kept in the plain loops).
template <typename T, bool Contig>
constexpr bool vectorised = kHaveVec && Contig && !std::is_same_v<T, double>;

}  // namespace qrnn::cpu::QRNN_ISA
