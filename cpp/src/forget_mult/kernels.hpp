// ForgetMult CPU kernels, templated over the storage type. This header is compiled once
// per instruction set (forget_mult/cpu_<isa>.cpp), each time inside its own namespace
// QRNN_ISA, so one binary carries generic, AVX2 and AVX-512 code paths; its end
// instantiates that set's table (common/isa_table.hpp).
//
// Work is split into items = (batch row, block of hidden units), walked in chunks of
// consecutive items step by step together (common/cpu_work_items.hpp). An item keeps its state
// in a float row; the loop over the block's hidden units is the vectorised one.
#pragma once

#include "common/cpu_kernel_common.hpp"
#include "common/isa_table.hpp"
#include "qrnn/forget_mult.hpp"

namespace qrnn::cpu::QRNN_ISA {

// One step of one row of the forward. A function of its own so that the restrict-qualified
// parameters tell the compiler no output aliases the state.
template <typename T, typename M, bool Contig>
inline void forward_row(const T* __restrict__ f, const T* __restrict__ x, M* __restrict__ state, T* __restrict__ h,
                        int64_t n, int64_t sf, int64_t sx, int64_t sh) {
    if constexpr (Contig && std::is_same_v<T, float16>) {
        float fr[kMaxRowBlock], xr[kMaxRowBlock];
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
}

// Contig: every hidden stride is 1, which lets the compiler vectorise the j loops.
template <typename T, bool Contig>
void forward_items(const ForgetMultForwardParams& p, int64_t begin, int64_t end) {
    using M = typename math_type<T>::type;
    const ItemChunks chunks(p.hidden, begin, end);
    const int64_t block = chunks.block;
    const int64_t sf = Contig ? 1 : p.f.stride_h, sx = Contig ? 1 : p.x.stride_h, sh = Contig ? 1 : p.h.stride_h;
    RowItem* items = scratch<RowItem, 0>(size_t(chunks.most));
    M* states = scratch<M, 1>(size_t(chunks.most * block));
    for (int64_t first = begin; first < end; first += chunks.per_chunk) {
        const int64_t count = chunks.count(first, end);
        describe_rows(p.hidden, block, first, count, items);
        for (int64_t i = 0; i < count; ++i) load_state(p.h0, p.h0_dtype, items[i].b, items[i].j0, items[i].n, &states[i * block]);
        for (int64_t t = 0; t < p.seq_len; ++t)
            for (int64_t i = 0; i < count; ++i)
                forward_row<T, M, Contig>(row_at<T>(p.f, t, items[i]), row_at<T>(p.x, t, items[i]), &states[i * block],
                                          row_at<T>(p.h, t, items[i]), items[i].n, sf, sx, sh);
    }
}

// One step of one row of the backward (t >= 1). A function of its own so that the
// restrict-qualified parameters tell the compiler no output aliases the running gradient.
template <typename T, typename M, bool Contig>
inline void backward_row(const T* __restrict__ f, const T* __restrict__ x, const T* __restrict__ hprev,
                         const T* __restrict__ dh, T* __restrict__ df, T* __restrict__ dx, M* __restrict__ grad,
                         int64_t n, int64_t sf, int64_t sx, int64_t sh, int64_t sg, int64_t sdf, int64_t sdx) {
    if constexpr (Contig && std::is_same_v<T, float16>) {
        float fr[kMaxRowBlock], xr[kMaxRowBlock], hr[kMaxRowBlock], gr[kMaxRowBlock];
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
}

// Walks time backwards with a running gradient g (the gradient reaching h[t]):
//   g += dh[t]; dx[t] = f[t] g; df[t] = (x[t] - h[t-1]) g; g -= f[t] g; and dh0 = g.
template <typename T, bool Contig>
void backward_items(const ForgetMultBackwardParams& p, int64_t begin, int64_t end) {
    using M = typename math_type<T>::type;
    const ItemChunks chunks(p.hidden, begin, end);
    const int64_t block = chunks.block;
    const int64_t sf = Contig ? 1 : p.f.stride_h, sx = Contig ? 1 : p.x.stride_h, sh = Contig ? 1 : p.h.stride_h,
                  sg = Contig ? 1 : p.grad_h.stride_h, sdf = Contig ? 1 : p.grad_f.stride_h,
                  sdx = Contig ? 1 : p.grad_x.stride_h;
    RowItem* items = scratch<RowItem, 0>(size_t(chunks.most));
    M* grads = scratch<M, 1>(size_t(chunks.most * block));
    M h0[kMaxRowBlock];
    for (int64_t first = begin; first < end; first += chunks.per_chunk) {
        const int64_t count = chunks.count(first, end);
        describe_rows(p.hidden, block, first, count, items);
        std::fill(grads, grads + count * block, M(0));
        for (int64_t t = p.seq_len - 1; t >= 0; --t) {
            for (int64_t i = 0; i < count; ++i) {
                const RowItem& it = items[i];
                M* __restrict__ grad = &grads[i * block];
                const T* __restrict__ f = row_at<T>(p.f, t, it);
                const T* __restrict__ dh = row_at<T>(p.grad_h, t, it);
                T* __restrict__ df = row_at<T>(p.grad_f, t, it);
                T* __restrict__ dx = row_at<T>(p.grad_x, t, it);
                if (t == 0) {  // h[-1] is h0 (zeros when absent)
                    const T* __restrict__ x = row_at<T>(p.x, t, it);
                    load_state(p.h0, p.h0_dtype, it.b, it.j0, it.n, h0);
                    for (int64_t j = 0; j < it.n; ++j) {
                        const M g = grad[j] + load<T, M>(dh, j, sg);
                        const M fv = load<T, M>(f, j, sf);
                        store<T, M>(dx, j, sdx, fv * g);
                        store<T, M>(df, j, sdf, (load<T, M>(x, j, sx) - h0[j]) * g);
                        grad[j] = g - fv * g;
                    }
                    continue;
                }
                backward_row<T, M, Contig>(f, row_at<T>(p.x, t, it), row_at<T>(p.h, t - 1, it), dh, df, dx, grad, it.n,
                                           sf, sx, sh, sg, sdf, sdx);
            }
        }
        if (p.grad_h0.data)  // an empty sequence gives zeros
            for (int64_t i = 0; i < count; ++i)
                store_state(p.grad_h0, p.h0_dtype, items[i].b, items[i].j0, items[i].n, &grads[i * block]);
    }
}

// The table's entry points: the contiguous or the strided variant.
template <>
struct Kernels<ForgetMultForwardParams, ForgetMultBackwardParams> {
    template <typename T>
    static void forward(const ForgetMultForwardParams& p, int64_t begin, int64_t end) {
        const bool contig = p.f.stride_h == 1 && p.x.stride_h == 1 && p.h.stride_h == 1;
        contig ? forward_items<T, true>(p, begin, end) : forward_items<T, false>(p, begin, end);
    }

    template <typename T>
    static void backward(const ForgetMultBackwardParams& p, int64_t begin, int64_t end) {
        const bool contig = p.f.stride_h == 1 && p.x.stride_h == 1 && p.h.stride_h == 1 &&
                            p.grad_h.stride_h == 1 && p.grad_f.stride_h == 1 && p.grad_x.stride_h == 1;
        contig ? backward_items<T, true>(p, begin, end) : backward_items<T, false>(p, begin, end);
    }
};

template const KernelTable<ForgetMultForwardParams, ForgetMultBackwardParams>&
kernel_table<ForgetMultForwardParams, ForgetMultBackwardParams>();

}  // namespace qrnn::cpu::QRNN_ISA
