// The activations of cpu_math.hpp sixteen float32 lanes at a time, written with AVX-512
// intrinsics, and the loads and stores of one vector of each storage type. Included only
// where the translation unit is built for AVX-512 (__AVX512F__), inside namespace QRNN_ISA.
//
// Why not leave it to the compiler: auto-vectorised, the scalar code of cpu_math.hpp ran
// about 150 instructions per 16 elements of the forward (its clamps became compare, mask
// and blend sequences, its bfloat16 loop was unrolled into register spills), which bound
// the 16-bit kernels by arithmetic rather than memory. Here every clamp is one min and one
// max, the shared division is an approximate reciprocal refined by one Newton step (within
// 2 ulp of 1/x, as the float32 tolerance needs), row tails are masked lanes rather than a
// scalar loop, and 16-bit values convert in registers.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "qrnn/dtype.hpp"

#ifndef QRNN_ISA
#error "define QRNN_ISA before including common/cpu_vec512.hpp"
#endif

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers start many intrinsics from a deliberately undefined register,
// which its -Wmaybe-uninitialized reports wherever they are inlined: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace qrnn::cpu::QRNN_ISA::vec512 {

using V = __m512;
constexpr int64_t kLanes = 16;

inline V splat(float v) { return _mm512_set1_ps(v); }

// The first min(n, 16) lanes.
inline __mmask16 lanes(int64_t n) { return n >= kLanes ? __mmask16(0xffff) : __mmask16((1u << n) - 1u); }

// ---- One vector of a storage type <-> 16 floats (masked lanes read as zero) -------------

template <typename T>
inline V load(const T* p, __mmask16 m) {
    if constexpr (std::is_same_v<T, float>) {
        return _mm512_maskz_loadu_ps(m, p);
    } else {
        const __m256i bits = _mm256_maskz_loadu_epi16(m, p);
        if constexpr (std::is_same_v<T, float16>) {
            return _mm512_maskz_cvtph_ps(m, bits);
        } else {
            return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
        }
    }
}

// float -> bfloat16 bits, round to nearest even, NaN kept quiet: from_float<bfloat16>
// (qrnn/dtype.hpp) lane by lane, bit for bit.
inline __m256i to_bfloat16_bits(V v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

template <typename T>
inline void store(T* p, __mmask16 m, V v) {
    if constexpr (std::is_same_v<T, float>) {
        _mm512_mask_storeu_ps(p, m, v);
    } else if constexpr (std::is_same_v<T, float16>) {
        _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
#if defined(__AVX512BF16__)
        // The same rounding and NaN in one instruction, except that it flushes float32
        // subnormals (below 1.2e-38) to zero.
        _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
#else
        _mm256_mask_storeu_epi16(p, m, to_bfloat16_bits(v));
#endif
    }
}

// ---- Activations: the rational tanh of cpu_math.hpp, same coefficients ----------------

struct Ratio { V num, den; };

// x P(x^2) and Q(x^2) for x clamped to [-limit, limit], P and Q of degree 4 given by their
// coefficients from the highest. max(-limit, x) keeps a NaN x (the second operand wins
// when unordered).
inline Ratio rational(V x, float limit, const float (&p_coef)[5], const float (&q_coef)[5]) {
    const V xc = _mm512_min_ps(splat(limit), _mm512_max_ps(splat(-limit), x));
    const V u = _mm512_mul_ps(xc, xc);
    V p = _mm512_fmadd_ps(splat(p_coef[0]), u, splat(p_coef[1]));
    V q = _mm512_fmadd_ps(splat(q_coef[0]), u, splat(q_coef[1]));
    for (int k = 2; k < 5; ++k) {
        p = _mm512_fmadd_ps(p, u, splat(p_coef[k]));
        q = _mm512_fmadd_ps(q, u, splat(q_coef[k]));
    }
    return {_mm512_mul_ps(xc, p), q};
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
inline Ratio tanh_ratio(V x) { return rational(x, 9.f, kTanhP, kTanhQ); }
// tanh(x / 2) = num / den, for the sigmoids.
inline Ratio half_tanh_ratio(V x) { return rational(x, 18.f, kHalfTanhP, kHalfTanhQ); }

// 1 / d for d in [1, 420^3] (or NaN): a 14-bit estimate and one Newton step.
inline V reciprocal(V d) {
    const V r = _mm512_rcp14_ps(d);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, splat(1.f)), r);
}

inline V clamp_unit(V t) { return _mm512_min_ps(splat(1.f), _mm512_max_ps(splat(-1.f), t)); }
inline V sigmoid_from_tanh(V t) { return _mm512_fmadd_ps(splat(0.5f), t, splat(0.5f)); }

// tanh(a), sigmoid(b), sigmoid(c) with one reciprocal.
inline void tanh_sigmoid_sigmoid(V a, V b, V c, V& ta, V& sb, V& sc) {
    const Ratio ra = tanh_ratio(a), rb = half_tanh_ratio(b), rc = half_tanh_ratio(c);
    const V dab = _mm512_mul_ps(ra.den, rb.den);
    const V r = reciprocal(_mm512_mul_ps(dab, rc.den));
    const V r_c = _mm512_mul_ps(r, rc.den);
    ta = clamp_unit(_mm512_mul_ps(ra.num, _mm512_mul_ps(r_c, rb.den)));
    sb = sigmoid_from_tanh(clamp_unit(_mm512_mul_ps(rb.num, _mm512_mul_ps(r_c, ra.den))));
    sc = sigmoid_from_tanh(clamp_unit(_mm512_mul_ps(rc.num, _mm512_mul_ps(r, dab))));
}

// tanh(a), sigmoid(b) with one reciprocal.
inline void tanh_sigmoid(V a, V b, V& ta, V& sb) {
    const Ratio ra = tanh_ratio(a), rb = half_tanh_ratio(b);
    const V r = reciprocal(_mm512_mul_ps(ra.den, rb.den));
    ta = clamp_unit(_mm512_mul_ps(ra.num, _mm512_mul_ps(r, rb.den)));
    sb = sigmoid_from_tanh(clamp_unit(_mm512_mul_ps(rb.num, _mm512_mul_ps(r, ra.den))));
}

}  // namespace qrnn::cpu::QRNN_ISA::vec512
