// The AArch64 NEON half of the CPU kernels' vector layer (common/cpu_vec.hpp): four float32
// lanes with FMA; float16 widened and rounded by FCVTL/FCVTN (every AArch64 CPU has them:
// no FP16 arithmetic needed), bfloat16 by shifts and the integer rounding of
// from_float<bfloat16> (no BF16 instructions needed). The same functions as cpu_vec512.hpp,
// so the rows written over them are the same code. Included by cpu_vec.hpp where the
// translation unit is the neon one (QRNN_ISA_NEON), inside namespace QRNN_ISA.
//
// A row's tail (fewer than 4 lanes) goes through a zero-filled stack vector
// (common/cpu_vec_tail.hpp), so lanes past the row read as zero and nothing past it is
// written.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <type_traits>

#include "qrnn/dtype.hpp"

#ifndef QRNN_ISA
#error "define QRNN_ISA before including common/cpu_vec128_neon.hpp"
#endif

// Every function of the layer is inlined wherever it is used: the rows call each one on
// every vector, and GCC, left to itself, kept the activations out of line once the rows'
// bodies appeared twice (whole vectors and the tail).
#ifndef QRNN_VEC_INLINE
#define QRNN_VEC_INLINE inline __attribute__((always_inline))
#endif

namespace qrnn::cpu::QRNN_ISA::vec {

using V = float32x4_t;
using Mask = int64_t;  // the lanes in use, 1 to 4
constexpr int64_t kLanes = 4;
constexpr const char* kName = "neon";

QRNN_VEC_INLINE V splat(float v) { return vdupq_n_f32(v); }

// ---- One vector of a storage type <-> 4 floats -------------------------------------------

template <typename T>
QRNN_VEC_INLINE V load_full(const T* p) {
    if constexpr (std::is_same_v<T, float>) {
        return vld1q_f32(p);
    } else {
        const uint16x4_t bits = vld1_u16(reinterpret_cast<const uint16_t*>(p));
        if constexpr (std::is_same_v<T, float16>) {
            return vcvt_f32_f16(vreinterpret_f16_u16(bits));
        } else {
            return vreinterpretq_f32_u32(vshll_n_u16(bits, 16));
        }
    }
}

// float -> bfloat16 bits, round to nearest even, NaN kept quiet: from_float<bfloat16>
// (qrnn/dtype.hpp) lane by lane, bit for bit.
QRNN_VEC_INLINE uint16x4_t to_bfloat16_bits(V v) {
    const uint32x4_t u = vreinterpretq_u32_f32(v);
    const uint32x4_t odd = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint32x4_t rounded = vshrq_n_u32(vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), odd), 16);
    const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
    const uint32x4_t quiet = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x40));
    return vmovn_u32(vbslq_u32(nan, quiet, rounded));
}

template <typename T>
QRNN_VEC_INLINE void store_full(T* p, V v) {
    if constexpr (std::is_same_v<T, float>) {
        vst1q_f32(p, v);
    } else if constexpr (std::is_same_v<T, float16>) {
        vst1_u16(reinterpret_cast<uint16_t*>(p), vreinterpret_u16_f16(vcvt_f16_f32(v)));
    } else {
        vst1_u16(reinterpret_cast<uint16_t*>(p), to_bfloat16_bits(v));
    }
}

}  // namespace qrnn::cpu::QRNN_ISA::vec

// Loads and stores of a partial vector: lanes(n), load(p, m), store(p, m, v).
#include "common/cpu_vec_tail.hpp"

namespace qrnn::cpu::QRNN_ISA::vec {

// ---- Arithmetic ---------------------------------------------------------------------------

QRNN_VEC_INLINE V add(V a, V b) { return vaddq_f32(a, b); }
QRNN_VEC_INLINE V sub(V a, V b) { return vsubq_f32(a, b); }
QRNN_VEC_INLINE V mul(V a, V b) { return vmulq_f32(a, b); }
QRNN_VEC_INLINE V fmadd(V a, V b, V c) { return vfmaq_f32(c, a, b); }   // a b + c
QRNN_VEC_INLINE V fnmadd(V a, V b, V c) { return vfmsq_f32(c, a, b); }  // c - a b
// FMIN/FMAX return NaN when either operand is NaN: min(limit, x) and max(-limit, x) keep a
// NaN x, as on x86.
QRNN_VEC_INLINE V min(V a, V b) { return vminq_f32(a, b); }
QRNN_VEC_INLINE V max(V a, V b) { return vmaxq_f32(a, b); }
// u (>= 0), or 0 where u is NaN (FMAXNM returns the number).
QRNN_VEC_INLINE V zero_if_nan(V u) { return vmaxnmq_f32(u, vdupq_n_f32(0.f)); }

// 1 / d for d in [1, 420^3] (or NaN): an 8-bit estimate and two Newton steps.
QRNN_VEC_INLINE V reciprocal(V d) {
    V r = vrecpeq_f32(d);
    r = vmulq_f32(vrecpsq_f32(d, r), r);
    return vmulq_f32(vrecpsq_f32(d, r), r);
}

QRNN_VEC_INLINE void prefetch(const void* p) { __builtin_prefetch(p, 0, 2); }

}  // namespace qrnn::cpu::QRNN_ISA::vec
