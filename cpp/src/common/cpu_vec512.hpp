// The AVX-512 half of the CPU kernels' vector layer (common/cpu_vec.hpp): sixteen float32
// lanes, the loads and stores of one vector of each storage type, and the arithmetic the
// activations and the kernels' rows are written in. Included by cpu_vec.hpp only where the
// translation unit is built for AVX-512 (__AVX512F__), inside namespace QRNN_ISA.
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
// which its -Wmaybe-uninitialized (or, once a mask is a constant, -Wuninitialized) reports
// wherever they are inlined: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// Every function of the layer is inlined wherever it is used: the rows call each one on
// every vector, and GCC, left to itself, kept the activations out of line once the rows'
// bodies appeared twice (whole vectors and the tail).
#ifndef QRNN_VEC_INLINE
#define QRNN_VEC_INLINE inline __attribute__((always_inline))
#endif

namespace qrnn::cpu::QRNN_ISA::vec {

using V = __m512;
using Mask = __mmask16;
constexpr int64_t kLanes = 16;
constexpr const char* kName = "avx512";

QRNN_VEC_INLINE V splat(float v) { return _mm512_set1_ps(v); }

// The first min(n, 16) lanes.
QRNN_VEC_INLINE Mask lanes(int64_t n) { return n >= kLanes ? __mmask16(0xffff) : __mmask16((1u << n) - 1u); }

// ---- One vector of a storage type <-> 16 floats (masked lanes read as zero) -------------

template <typename T>
QRNN_VEC_INLINE V load(const T* p, __mmask16 m) {
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
QRNN_VEC_INLINE __m256i to_bfloat16_bits(V v) {
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
QRNN_VEC_INLINE void store(T* p, __mmask16 m, V v) {
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

// ---- Arithmetic (what cpu_vec.hpp's activations and the kernels' rows are written in) ----

QRNN_VEC_INLINE V add(V a, V b) { return _mm512_add_ps(a, b); }
QRNN_VEC_INLINE V sub(V a, V b) { return _mm512_sub_ps(a, b); }
QRNN_VEC_INLINE V mul(V a, V b) { return _mm512_mul_ps(a, b); }
QRNN_VEC_INLINE V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }    // a b + c
QRNN_VEC_INLINE V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
// The second operand wins when unordered: min(limit, x) and max(-limit, x) keep a NaN x.
QRNN_VEC_INLINE V min(V a, V b) { return _mm512_min_ps(a, b); }
QRNN_VEC_INLINE V max(V a, V b) { return _mm512_max_ps(a, b); }
// u (>= 0), or 0 where u is NaN.
QRNN_VEC_INLINE V zero_if_nan(V u) { return _mm512_max_ps(u, _mm512_setzero_ps()); }

// 1 / d for d in [1, 420^3] (or NaN): a 14-bit estimate and one Newton step (within 2 ulp).
QRNN_VEC_INLINE V reciprocal(V d) {
    const V r = _mm512_rcp14_ps(d);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, splat(1.f)), r);
}

// Asks for the line holding p into L2.
QRNN_VEC_INLINE void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }

}  // namespace qrnn::cpu::QRNN_ISA::vec
