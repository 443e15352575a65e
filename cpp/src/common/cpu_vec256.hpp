// The AVX2 half of the CPU kernels' vector layer (common/cpu_vec.hpp): eight float32 lanes
// with FMA, float16 through F16C, bfloat16 by shifts and the integer rounding of
// from_float<bfloat16>. The same functions as cpu_vec512.hpp, so the rows written over them
// are the same code. Included by cpu_vec.hpp where the translation unit is built for AVX2,
// FMA and F16C (and not AVX-512), inside namespace QRNN_ISA.
//
// AVX2 has no masked 16-bit loads: a row's tail (fewer than 8 lanes) goes through a
// zero-filled stack vector (common/cpu_vec_tail.hpp), so lanes past the row read as zero and
// nothing past it is written.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "qrnn/dtype.hpp"

#ifndef QRNN_ISA
#error "define QRNN_ISA before including common/cpu_vec256.hpp"
#endif

// Every function of the layer is inlined wherever it is used: the rows call each one on
// every vector, and GCC, left to itself, kept the activations out of line once the rows'
// bodies appeared twice (whole vectors and the tail).
#ifndef QRNN_VEC_INLINE
#define QRNN_VEC_INLINE inline __attribute__((always_inline))
#endif

namespace qrnn::cpu::QRNN_ISA::vec {

using V = __m256;
using Mask = int64_t;  // the lanes in use, 1 to 8
constexpr int64_t kLanes = 8;
constexpr const char* kName = "avx2";

QRNN_VEC_INLINE V splat(float v) { return _mm256_set1_ps(v); }

// ---- One vector of a storage type <-> 8 floats -------------------------------------------

template <typename T>
QRNN_VEC_INLINE V load_full(const T* p) {
    if constexpr (std::is_same_v<T, float>) {
        return _mm256_loadu_ps(p);
    } else {
        const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        if constexpr (std::is_same_v<T, float16>) {
            return _mm256_cvtph_ps(bits);
        } else {
            return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
        }
    }
}

// float -> bfloat16 bits, round to nearest even, NaN kept quiet: from_float<bfloat16>
// (qrnn/dtype.hpp) lane by lane, bit for bit.
QRNN_VEC_INLINE __m128i to_bfloat16_bits(V v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i bits = _mm256_blendv_epi8(rounded, quiet, nan);
    // Every lane holds 16 bits: the unsigned-saturating pack keeps them.
    return _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
}

template <typename T>
QRNN_VEC_INLINE void store_full(T* p, V v) {
    if constexpr (std::is_same_v<T, float>) {
        _mm256_storeu_ps(p, v);
    } else if constexpr (std::is_same_v<T, float16>) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    } else {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bfloat16_bits(v));
    }
}

}  // namespace qrnn::cpu::QRNN_ISA::vec

// Loads and stores of a partial vector: lanes(n), load(p, m), store(p, m, v).
#include "common/cpu_vec_tail.hpp"

namespace qrnn::cpu::QRNN_ISA::vec {

// ---- Arithmetic ---------------------------------------------------------------------------

QRNN_VEC_INLINE V add(V a, V b) { return _mm256_add_ps(a, b); }
QRNN_VEC_INLINE V sub(V a, V b) { return _mm256_sub_ps(a, b); }
QRNN_VEC_INLINE V mul(V a, V b) { return _mm256_mul_ps(a, b); }
QRNN_VEC_INLINE V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }    // a b + c
QRNN_VEC_INLINE V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a b
// The second operand wins when unordered: min(limit, x) and max(-limit, x) keep a NaN x.
QRNN_VEC_INLINE V min(V a, V b) { return _mm256_min_ps(a, b); }
QRNN_VEC_INLINE V max(V a, V b) { return _mm256_max_ps(a, b); }
// u (>= 0), or 0 where u is NaN.
QRNN_VEC_INLINE V zero_if_nan(V u) { return _mm256_max_ps(u, _mm256_setzero_ps()); }

// 1 / d for d in [1, 420^3] (or NaN): a 12-bit estimate and one Newton step (within 3 ulp).
QRNN_VEC_INLINE V reciprocal(V d) {
    const V r = _mm256_rcp_ps(d);
    return _mm256_fmadd_ps(r, _mm256_fnmadd_ps(d, r, splat(1.f)), r);
}

QRNN_VEC_INLINE void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }

}  // namespace qrnn::cpu::QRNN_ISA::vec
