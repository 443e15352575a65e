// ForgetMult CPU kernels, templated over the storage type. This header is compiled
// once per instruction set (see forget_mult_cpu_<isa>.cpp), each time inside its own
// namespace QRNN_ISA, so one binary carries generic, AVX2 and AVX-512 code paths.
//
// Work is split into items = (batch row, block of kBlock hidden units). An item walks
// time serially and keeps its state in a local float array; the loop over the
// block's hidden units is the vectorised one (contiguous along hidden).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu_kernel_common.hpp"
#include "forget_mult_table.hpp"
#include "qrnn/forget_mult.hpp"

#ifndef QRNN_ISA
#error "define QRNN_ISA before including forget_mult_kernels.hpp"
#endif

namespace qrnn::cpu::QRNN_ISA {

constexpr int64_t kBlock = forget_mult_block;

// Contig: every hidden stride is 1, which lets the compiler vectorise the j loop.
template <typename T, bool Contig>
void forward_items(const ForgetMultForwardParams& p, int64_t begin, int64_t end) {
    using M = typename math_type<T>::type;
    const int64_t blocks = (p.hidden + kBlock - 1) / kBlock;
    M state[kBlock];
    for (int64_t item = begin; item < end; ++item) {
        const int64_t b = item / blocks, j0 = (item % blocks) * kBlock;
        const int64_t n = std::min(kBlock, p.hidden - j0);
        load_state(p.h0, p.h0_dtype, b, j0, n, state);
        const int64_t sf = Contig ? 1 : p.f.stride_h, sx = Contig ? 1 : p.x.stride_h,
                      sh = Contig ? 1 : p.h.stride_h;
        const T* __restrict__ f = at<T>(p.f.data, b * p.f.stride_b + j0 * p.f.stride_h);
        const T* __restrict__ x = at<T>(p.x.data, b * p.x.stride_b + j0 * p.x.stride_h);
        T* __restrict__ h = at<T>(p.h.data, b * p.h.stride_b + j0 * p.h.stride_h);
        for (int64_t t = 0; t < p.seq_len; ++t) {
            if constexpr (Contig && is_16bit<T>) {
                float fr[kBlock], xr[kBlock];
                row_to_float(f, fr, n);
                row_to_float(x, xr, n);
                for (int64_t j = 0; j < n; ++j) state[j] = fr[j] * xr[j] + (1.f - fr[j]) * state[j];
                row_from_float(state, h, n);
            } else {
                for (int64_t j = 0; j < n; ++j) {
                    const M fv = load<T, M>(f, j, sf);
                    const M s = fv * load<T, M>(x, j, sx) + (M(1) - fv) * state[j];
                    state[j] = s;
                    store<T, M>(h, j, sh, s);
                }
            }
            f += p.f.stride_t;
            x += p.x.stride_t;
            h += p.h.stride_t;
        }
    }
}

// Walks time backwards with a running gradient g (the gradient reaching h[t]):
//   g += dh[t]; dx[t] = f[t] g; df[t] = (x[t] - h[t-1]) g; g -= f[t] g; and dh0 = g.
template <typename T, bool Contig>
void backward_items(const ForgetMultBackwardParams& p, int64_t begin, int64_t end) {
    using M = typename math_type<T>::type;
    const int64_t blocks = (p.hidden + kBlock - 1) / kBlock;
    M grad[kBlock];
    M h0[kBlock];
    for (int64_t item = begin; item < end; ++item) {
        const int64_t b = item / blocks, j0 = (item % blocks) * kBlock;
        const int64_t n = std::min(kBlock, p.hidden - j0);
        std::fill(grad, grad + n, M(0));
        load_state(p.h0, p.h0_dtype, b, j0, n, h0);
        const int64_t sf = Contig ? 1 : p.f.stride_h, sx = Contig ? 1 : p.x.stride_h,
                      sh = Contig ? 1 : p.h.stride_h, sg = Contig ? 1 : p.grad_h.stride_h,
                      sdf = Contig ? 1 : p.grad_f.stride_h, sdx = Contig ? 1 : p.grad_x.stride_h;
        const int64_t last = p.seq_len - 1;
        if (last < 0) {  // empty sequence: the gradient reaching h0 is zero
            if (p.grad_h0.data) store_state(p.grad_h0, p.h0_dtype, b, j0, n, grad);
            continue;
        }
        const int64_t prev = last >= 1 ? last - 1 : 0;  // only read when last >= 1
        const T* __restrict__ f = at<T>(p.f.data, last * p.f.stride_t + b * p.f.stride_b + j0 * p.f.stride_h);
        const T* __restrict__ x = at<T>(p.x.data, last * p.x.stride_t + b * p.x.stride_b + j0 * p.x.stride_h);
        const T* __restrict__ hprev = at<T>(p.h.data, prev * p.h.stride_t + b * p.h.stride_b + j0 * p.h.stride_h);
        const T* __restrict__ dh = at<T>(p.grad_h.data, last * p.grad_h.stride_t + b * p.grad_h.stride_b + j0 * p.grad_h.stride_h);
        T* __restrict__ df = at<T>(p.grad_f.data, last * p.grad_f.stride_t + b * p.grad_f.stride_b + j0 * p.grad_f.stride_h);
        T* __restrict__ dx = at<T>(p.grad_x.data, last * p.grad_x.stride_t + b * p.grad_x.stride_b + j0 * p.grad_x.stride_h);
        for (int64_t t = last; t >= 1; --t) {
            if constexpr (Contig && is_16bit<T>) {
                float fr[kBlock], xr[kBlock], hr[kBlock], gr[kBlock];
                row_to_float(f, fr, n);
                row_to_float(x, xr, n);
                row_to_float(hprev, hr, n);
                row_to_float(dh, gr, n);
                for (int64_t j = 0; j < n; ++j) {
                    const float g = grad[j] + gr[j];
                    xr[j] = (xr[j] - hr[j]) * g;  // grad_f, in place
                    gr[j] = fr[j] * g;             // grad_x, in place
                    grad[j] = g - fr[j] * g;
                }
                row_from_float(xr, df, n);
                row_from_float(gr, dx, n);
            } else {
                for (int64_t j = 0; j < n; ++j) {
                    const M g = grad[j] + load<T, M>(dh, j, sg);
                    const M fv = load<T, M>(f, j, sf);
                    store<T, M>(dx, j, sdx, fv * g);
                    store<T, M>(df, j, sdf, (load<T, M>(x, j, sx) - load<T, M>(hprev, j, sh)) * g);
                    grad[j] = g - fv * g;
                }
            }
            f -= p.f.stride_t;
            x -= p.x.stride_t;
            hprev -= p.h.stride_t;
            dh -= p.grad_h.stride_t;
            df -= p.grad_f.stride_t;
            dx -= p.grad_x.stride_t;
        }
        for (int64_t j = 0; j < n; ++j) {  // t = 0 reads h0 instead of h[-1]
            const M g = grad[j] + load<T, M>(dh, j, sg);
            const M fv = load<T, M>(f, j, sf);
            store<T, M>(dx, j, sdx, fv * g);
            store<T, M>(df, j, sdf, (load<T, M>(x, j, sx) - h0[j]) * g);
            grad[j] = g - fv * g;
        }
        if (p.grad_h0.data) store_state(p.grad_h0, p.h0_dtype, b, j0, n, grad);
    }
}

template <typename T>
void forward(const ForgetMultForwardParams& p, int64_t begin, int64_t end) {
    const bool contig = p.f.stride_h == 1 && p.x.stride_h == 1 && p.h.stride_h == 1;
    contig ? forward_items<T, true>(p, begin, end) : forward_items<T, false>(p, begin, end);
}

template <typename T>
void backward(const ForgetMultBackwardParams& p, int64_t begin, int64_t end) {
    const bool contig = p.f.stride_h == 1 && p.x.stride_h == 1 && p.h.stride_h == 1 &&
                        p.grad_h.stride_h == 1 && p.grad_f.stride_h == 1 && p.grad_x.stride_h == 1;
    contig ? backward_items<T, true>(p, begin, end) : backward_items<T, false>(p, begin, end);
}

}  // namespace qrnn::cpu::QRNN_ISA
