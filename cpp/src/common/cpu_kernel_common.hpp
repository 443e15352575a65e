// Helpers shared by the CPU kernels (ForgetMult, fused QRNN gates): typed access into
// strided arrays and the float32 (float64) state they carry. Compiled once per
// instruction set inside namespace QRNN_ISA, like the kernels that include it, so no
// inline function compiled with AVX-512 flags can leak into the generic path.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "common/cpu_work_items.hpp"
#include "qrnn/dtype.hpp"
#include "qrnn/view.hpp"

#ifndef QRNN_ISA
#error "define QRNN_ISA before including common/cpu_kernel_common.hpp"
#endif

namespace qrnn::cpu::QRNN_ISA {

template <typename T>
inline const T* at(const void* base, int64_t offset) {
    return static_cast<const T*>(base) + offset;
}
template <typename T>
inline T* at(void* base, int64_t offset) {
    return static_cast<T*>(base) + offset;
}

// A state (h0, c0, their gradients, a final state) may be float32 while the sequence is
// 16-bit: read and write it by its own dtype. Absent (null) reads as zeros.
template <typename M>
inline void load_state(const ConstView2& v, DType dt, int64_t b, int64_t j0, int64_t n, M* out) {
    if (!v.data) {
        std::fill(out, out + n, M(0));
        return;
    }
    const int64_t base = b * v.stride_b + j0 * v.stride_h;
    for (int64_t j = 0; j < n; ++j) {
        const int64_t o = base + j * v.stride_h;
        switch (dt) {
            case DType::float32: out[j] = M(*at<float>(v.data, o)); break;
            case DType::float64: out[j] = M(*at<double>(v.data, o)); break;
            case DType::bfloat16: out[j] = M(to_float(*at<bfloat16>(v.data, o))); break;
            case DType::float16: out[j] = M(to_float(*at<float16>(v.data, o))); break;
        }
    }
}

template <typename M>
inline void store_state(const View2& v, DType dt, int64_t b, int64_t j0, int64_t n, const M* in) {
    const int64_t base = b * v.stride_b + j0 * v.stride_h;
    for (int64_t j = 0; j < n; ++j) {
        const int64_t o = base + j * v.stride_h;
        switch (dt) {
            case DType::float32: *at<float>(v.data, o) = float(in[j]); break;
            case DType::float64: *at<double>(v.data, o) = double(in[j]); break;
            case DType::bfloat16: *at<bfloat16>(v.data, o) = from_float<bfloat16>(float(in[j])); break;
            case DType::float16: *at<float16>(v.data, o) = from_float<float16>(float(in[j])); break;
        }
    }
}

// Element j of a strided row, converted to the math type M (and back).
template <typename T, typename M>
inline M load(const T* p, int64_t j, int64_t stride) {
    return M(to_math(p[j * stride]));
}
template <typename T, typename M>
inline void store(T* p, int64_t j, int64_t stride, M v) {
    p[j * stride] = from_float<T>(v);
}
template <>
inline void store<double, double>(double* p, int64_t j, int64_t stride, double v) {
    p[j * stride] = v;
}

// Whole-row conversions for contiguous 16-bit rows: converting a row into a float buffer
// and computing on that keeps every loop simple enough for the compiler to vectorise.
template <typename T>
inline void row_to_float(const T* __restrict__ src, float* __restrict__ dst, int64_t n) {
    for (int64_t j = 0; j < n; ++j) dst[j] = to_float(src[j]);
}
template <typename T>
inline void row_from_float(const float* __restrict__ src, T* __restrict__ dst, int64_t n) {
    for (int64_t j = 0; j < n; ++j) dst[j] = from_float<T>(src[j]);
}
#if defined(__F16C__)
// The hardware half <-> float conversions, eight lanes at a time.
template <>
inline void row_to_float<float16>(const float16* __restrict__ src, float* __restrict__ dst, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j))));
    for (; j < n; ++j) dst[j] = _cvtsh_ss(src[j].bits);
}
template <>
inline void row_from_float<float16>(const float* __restrict__ src, float16* __restrict__ dst, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT));
    for (; j < n; ++j) dst[j].bits = _cvtss_sh(src[j], _MM_FROUND_TO_NEAREST_INT);
}
#endif

// A row of zeros (padding).
template <typename T>
inline void zero_row(T* __restrict__ dst, int64_t n, int64_t stride) {
    const T zero = from_float<T>(0.f);
    for (int64_t j = 0; j < n; ++j) dst[j * stride] = zero;
}

// ---- Work items (common/cpu_work_items.hpp says how they are sized and walked) ----------------

// One work item: sequence b's block of hidden units [j0, j0 + n), and where the sequence's
// steps are: `steps` real steps from time t0 of the arrays' batch row `row`. A dense call
// has row b from t0 = 0 (steps = seq_len, or lengths[b]); a packed call (cu_seqlens) has
// every sequence in row 0, sequence b from t0 = cu_seqlens[b]. The states (h0, the final
// state and their gradients) have one row per sequence: row b.
struct RowItem { int64_t b, j0, n, t0 = 0, steps = 0, row = 0; };

// Items first .. first + count - 1 of `hidden`'s blocks of `block` units, with their
// sequence's steps from the family's params (its seq_len, lengths and cu_seqlens fields).
template <typename Params>
inline void describe_items(const Params& p, int64_t block, int64_t first, int64_t count, RowItem* items) {
    const int64_t blocks = (p.hidden + block - 1) / block;
    for (int64_t i = 0; i < count; ++i) {
        const int64_t item = first + i, b = item / blocks, j0 = (item % blocks) * block;
        RowItem& it = items[i];
        it.b = b, it.j0 = j0, it.n = std::min(block, p.hidden - j0);
        if (p.cu_seqlens) {
            it.row = 0, it.t0 = p.cu_seqlens[b], it.steps = p.cu_seqlens[b + 1] - it.t0;
        } else {
            it.row = b, it.t0 = 0, it.steps = p.lengths ? p.lengths[b * p.lengths_stride] : p.seq_len;
        }
    }
}

// The most steps of items[0, count): how long a chunk of items walks.
inline int64_t most_steps(const RowItem* items, int64_t count) {
    int64_t most = 0;
    for (int64_t i = 0; i < count; ++i) most = std::max(most, items[i].steps);
    return most;
}

// Time index of an item's k-th step, walked forwards or (reverse) from its last real step.
inline int64_t step_time(int64_t k, const RowItem& it, bool reverse) {
    return it.t0 + (reverse ? it.steps - 1 - k : k);
}

// Whether a dense row has padding after its real steps (written as zeros): a packed row's
// steps all belong to some sequence.
template <typename Params>
inline bool pads(const Params& p, const RowItem& it) {
    return !p.cu_seqlens && it.steps < p.seq_len;
}

// Per-thread scratch of at least n elements, kept across calls so that a kernel call
// allocates nothing (a per-call heap allocation in the worker threads can make glibc trim
// the caller's freed outputs away, to be page-faulted back in by the next call). Slot
// tells apart buffers of one type; kernels never nest, so they may share slots.
template <typename E, int Slot>
E* scratch(size_t n) {
    thread_local std::vector<E> buffer;
    if (buffer.size() < n) buffer.resize(n);
    return buffer.data();
}

// Element offset of item `it`'s row at time t (an index of the arrays, see step_time) in a
// strided (time, batch, hidden) view.
template <typename V>
inline int64_t row_offset(const V& v, int64_t t, const RowItem& it) {
    return t * v.stride_t + it.row * v.stride_b + it.j0 * v.stride_h;
}

// Item `it`'s row at time t of a strided view, as T (const for a ConstView3).
template <typename T, typename V>
inline auto row_at(const V& v, int64_t t, const RowItem& it) {
    return at<T>(v.data, row_offset(v, t, it));
}

template <typename T>
constexpr bool is_16bit = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// float -> IEEE half bits, the same rounding as from_float<float16> (nearest even,
// overflow to Inf, subnormals kept, NaN quiet) but with selects instead of branches,
// so that loops storing half vectorise (where F16C is not built in).
inline float16 to_half(float v) {
    const uint32_t bits = float_to_bits(v);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    const uint32_t u = bits & 0x7fffffffu;
    const uint32_t normal = (u + (uint32_t(15 - 127) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
    const uint32_t subnormal = float_to_bits(bits_to_float(u) + 0.5f) - float_to_bits(0.5f);
    uint32_t out = u < 0x38800000u ? subnormal : normal;
    out = u >= 0x477ff000u ? 0x7c00u : out;
    out = u > 0x7f800000u ? 0x7e00u : out;
    return float16{uint16_t(out | sign)};
}

}  // namespace qrnn::cpu::QRNN_ISA
