// ForgetMult CPU kernels, templated over the storage type. This header is compiled once
// per instruction set (forget_mult/cpu_<isa>.cpp), each time inside its own namespace
// QRNN_ISA, so one binary carries generic, AVX2 and AVX-512 code paths; its end
// instantiates that set's table (common/isa_table.hpp).
//
// The time loop is the shared scan core's (common/cpu_scan.hpp); this file holds what is
// ForgetMult's own: one step of one row, forward and backward, the loop over the row's
// hidden units being the vectorised one.
#pragma once

#include "common/cpu_scan.hpp"
#include "common/cpu_vec.hpp"
#include "common/isa_table.hpp"
#include "qrnn/forget_mult.hpp"

namespace qrnn::cpu::QRNN_ISA {

#if defined(QRNN_HAVE_VEC)
// Contiguous float32 and 16-bit rows on the vector layer (common/cpu_vec.hpp): the loads
// convert in registers, the math is the plain loops' below.
template <typename T>
inline void vector_forward_row(const T* __restrict__ f, const T* __restrict__ x, float* __restrict__ state,
                               T* __restrict__ h, int64_t n) {
    using namespace vec;
    for_each_vector(n, [&](int64_t j, Mask m) QRNN_VEC_BODY {
        const V fv = load(f + j, m);
        const V s = fmadd(fv, load(x + j, m), mul(sub(splat(1.f), fv), load(state + j, m)));
        store(state + j, m, s);
        store(h + j, m, s);
    });
}

template <typename T, typename HP>
inline void vector_backward_row(const T* __restrict__ f, const T* __restrict__ x, const HP* __restrict__ hprev,
                                const T* __restrict__ dh, T* __restrict__ df, T* __restrict__ dx,
                                float* __restrict__ grad, int64_t n) {
    using namespace vec;
    for_each_vector(n, [&](int64_t j, Mask m) QRNN_VEC_BODY {
        const V g = add(load(grad + j, m), load(dh + j, m));
        const V fv = load(f + j, m);
        store(dx + j, m, mul(fv, g));
        store(df + j, m, mul(sub(load(x + j, m), load(hprev + j, m)), g));
        store(grad + j, m, fnmadd(fv, g, g));
    });
}
#else
// Declared for the discarded `if constexpr` branches; never instantiated without the layer.
template <typename... Args>
void vector_forward_row(Args...);
template <typename... Args>
void vector_backward_row(Args...);
#endif

// One step of one row of the forward. A function of its own so that the restrict-qualified
// parameters tell the compiler no output aliases the state.
template <typename T, typename M, bool Contig>
inline void forward_row(const T* __restrict__ f, const T* __restrict__ x, M* __restrict__ state, T* __restrict__ h,
                        int64_t n, int64_t sf, int64_t sx, int64_t sh) {
    if constexpr (vectorised<T, Contig>) {
        vector_forward_row(f, x, state, h, n);
    } else if constexpr (Contig && std::is_same_v<T, float16>) {
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

// One step of one row of the backward; h_prev is h[t-1] (T), or h0 as the math type at t = 0. A function of its own so
// that the restrict-qualified parameters tell the compiler no output aliases the running gradient.
template <typename T, typename M, bool Contig, typename HP>
inline void backward_row(const T* __restrict__ f, const T* __restrict__ x, const HP* __restrict__ hprev,
                         const T* __restrict__ dh, T* __restrict__ df, T* __restrict__ dx, M* __restrict__ grad,
                         int64_t n, int64_t sf, int64_t sx, int64_t sh, int64_t sg, int64_t sdf, int64_t sdx) {
    if constexpr (vectorised<T, Contig>) {
        vector_backward_row(f, x, hprev, dh, df, dx, grad, n);
    } else if constexpr (Contig && std::is_same_v<T, float16> && std::is_same_v<HP, T>) {
        float fr[kMaxRowBlock], xr[kMaxRowBlock], hr[kMaxRowBlock], gr[kMaxRowBlock];
        row_to_float(f, fr, n);
        row_to_float(x, xr, n);
        row_to_float(hprev, hr, n);
        row_to_float(dh, gr, n);
        for (int64_t j = 0; j < n; ++j) {
            const float g = grad[j] + gr[j];
            xr[j] = (xr[j] - hr[j]) * g;  // grad_f, in place
            gr[j] = fr[j] * g;            // grad_x, in place
            grad[j] = g - fr[j] * g;
        }
        row_from_float(xr, df, n);
        row_from_float(gr, dx, n);
    } else {
        for (int64_t j = 0; j < n; ++j) {
            const M g = grad[j] + load<T, M>(dh, j, sg);
            const M fv = load<T, M>(f, j, sf);
            store<T, M>(dx, j, sdx, fv * g);
            store<T, M>(df, j, sdf, (load<T, M>(x, j, sx) - load<HP, M>(hprev, j, sh)) * g);
            grad[j] = g - fv * g;
        }
    }
}

// The ForgetMult family on the shared scan loop (common/cpu_scan.hpp).
struct ForgetMultScan {
    using Forward = ForgetMultForwardParams;
    using Backward = ForgetMultBackwardParams;

    static bool contiguous(const Forward& p) { return p.f.stride_h == 1 && p.x.stride_h == 1 && p.h.stride_h == 1; }
    static bool contiguous(const Backward& p) {
        return p.f.stride_h == 1 && p.x.stride_h == 1 && p.h.stride_h == 1 && p.grad_h.stride_h == 1 &&
               p.grad_f.stride_h == 1 && p.grad_x.stride_h == 1;
    }

    template <typename T, typename M, bool Contig>
    static void forward_row(const Forward& p, int64_t t, const RowItem& it, M* state) {
        QRNN_ISA::forward_row<T, M, Contig>(row_at<T>(p.f, t, it), row_at<T>(p.x, t, it), state, row_at<T>(p.h, t, it),
                                            it.n, Contig ? 1 : p.f.stride_h, Contig ? 1 : p.x.stride_h,
                                            Contig ? 1 : p.h.stride_h);
    }

    template <typename T, bool Contig>
    static void pad_row(const Backward& p, int64_t t, const RowItem& it) {
        zero_row(row_at<T>(p.grad_f, t, it), it.n, Contig ? 1 : p.grad_f.stride_h);
        zero_row(row_at<T>(p.grad_x, t, it), it.n, Contig ? 1 : p.grad_x.stride_h);
    }

    // The running gradient g (reaching h[t]): g += dh[t]; dx[t] = f[t] g; df[t] = (x[t] - h[t-1]) g;
    // g -= f[t] g.
    template <typename T, typename M, bool Contig, typename HP>
    static void backward_row(const Backward& p, int64_t t, const RowItem& it, const HP* h_prev, int64_t sh, M* grad) {
        QRNN_ISA::backward_row<T, M, Contig>(row_at<T>(p.f, t, it), row_at<T>(p.x, t, it), h_prev,
                                             row_at<T>(p.grad_h, t, it), row_at<T>(p.grad_f, t, it),
                                             row_at<T>(p.grad_x, t, it), grad, it.n, Contig ? 1 : p.f.stride_h,
                                             Contig ? 1 : p.x.stride_h, sh, Contig ? 1 : p.grad_h.stride_h,
                                             Contig ? 1 : p.grad_f.stride_h, Contig ? 1 : p.grad_x.stride_h);
    }
};

template <>
struct Kernels<ForgetMultForwardParams, ForgetMultBackwardParams> : ScanKernels<ForgetMultScan> {
    static constexpr const char* rows = kRowsName;
};

template const KernelTable<ForgetMultForwardParams, ForgetMultBackwardParams>&
kernel_table<ForgetMultForwardParams, ForgetMultBackwardParams>();

}  // namespace qrnn::cpu::QRNN_ISA
