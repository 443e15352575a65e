// linear_scan CPU kernels, templated over the storage type: the family's steps on the
// shared scan loop (common/cpu_scan.hpp). Compiled once per instruction set
// (linear_scan/cpu_<isa>.cpp), each time inside its own namespace QRNN_ISA; the end
// instantiates that set's table (common/isa_table.hpp).
#pragma once

#include "common/cpu_scan.hpp"
#include "common/cpu_vec.hpp"
#include "common/isa_table.hpp"
#include "qrnn/linear_scan.hpp"

namespace qrnn::cpu::QRNN_ISA {

#if defined(QRNN_HAVE_VEC)
// Contiguous float32 and 16-bit rows on the vector layer (common/cpu_vec.hpp): ForgetMult's
// vector rows (forget_mult/kernels.hpp), the same loop and loads, with a for 1 - f and b
// for f x, so the two families run at the same speed on every instruction set.
template <typename T>
inline void vector_step(const T* __restrict__ a, const T* __restrict__ b, float* __restrict__ state, T* __restrict__ h,
                        int64_t n) {
    using namespace vec;
    for_each_vector(n, [&](int64_t j, Mask m) QRNN_VEC_BODY {
        const V s = fmadd(load(a + j, m), load(state + j, m), load(b + j, m));
        store(state + j, m, s);
        store(h + j, m, s);
    });
}

template <typename T, typename HP>
inline void vector_adjoint(const T* __restrict__ a, const HP* __restrict__ h_prev, const T* __restrict__ dh,
                           T* __restrict__ da, T* __restrict__ db, float* __restrict__ grad, int64_t n) {
    using namespace vec;
    for_each_vector(n, [&](int64_t j, Mask m) QRNN_VEC_BODY {
        const V g = add(load(grad + j, m), load(dh + j, m));
        store(db + j, m, g);
        store(da + j, m, mul(load(h_prev + j, m), g));
        store(grad + j, m, mul(load(a + j, m), g));
    });
}
#else
// Declared for the discarded `if constexpr` branches; never instantiated without the layer.
template <typename... Args>
void vector_step(Args...);
template <typename... Args>
void vector_adjoint(Args...);
#endif

struct LinearScan {
    using Forward = LinearScanForwardParams;
    using Backward = LinearScanBackwardParams;

    static bool contiguous(const Forward& p) { return p.a.stride_h == 1 && p.b.stride_h == 1 && p.h.stride_h == 1; }
    static bool contiguous(const Backward& p) {
        return p.a.stride_h == 1 && p.h.stride_h == 1 && p.grad_h.stride_h == 1 && p.grad_a.stride_h == 1 &&
               p.grad_b.stride_h == 1;
    }

    // state = a[t] state + b[t]; h[t] = state.
    template <typename T, typename M, bool Contig>
    static void forward_row(const Forward& p, int64_t t, const RowItem& it, M* __restrict__ state) {
        step<T, M, Contig>(row_at<T>(p.a, t, it), row_at<T>(p.b, t, it), state, row_at<T>(p.h, t, it), it.n,
                           Contig ? 1 : p.a.stride_h, Contig ? 1 : p.b.stride_h, Contig ? 1 : p.h.stride_h);
    }

    template <typename T, bool Contig>
    static void pad_row(const Backward& p, int64_t t, const RowItem& it) {
        zero_row(row_at<T>(p.grad_a, t, it), it.n, Contig ? 1 : p.grad_a.stride_h);
        zero_row(row_at<T>(p.grad_b, t, it), it.n, Contig ? 1 : p.grad_b.stride_h);
    }

    // The running gradient g (reaching h[t]): g += dh[t]; db[t] = g; da[t] = h[t-1] g; g *= a[t].
    template <typename T, typename M, bool Contig, typename HP>
    static void backward_row(const Backward& p, int64_t t, const RowItem& it, const HP* h_prev, int64_t sh, M* grad) {
        adjoint<T, M, Contig, HP>(row_at<T>(p.a, t, it), h_prev, row_at<T>(p.grad_h, t, it), row_at<T>(p.grad_a, t, it),
                                  row_at<T>(p.grad_b, t, it), grad, it.n, Contig ? 1 : p.a.stride_h, sh,
                                  Contig ? 1 : p.grad_h.stride_h, Contig ? 1 : p.grad_a.stride_h,
                                  Contig ? 1 : p.grad_b.stride_h);
    }

    // Functions of their own so that the restrict-qualified parameters tell the compiler no
    // output aliases the state; contiguous half rows are converted whole (F16C where built).
    template <typename T, typename M, bool Contig>
    static void step(const T* __restrict__ a, const T* __restrict__ b, M* __restrict__ state, T* __restrict__ h,
                     int64_t n, int64_t sa, int64_t sb, int64_t sh) {
        if constexpr (vectorised<T, Contig>) {
            vector_step(a, b, state, h, n);
        } else if constexpr (Contig && std::is_same_v<T, float16>) {
            float ar[kMaxRowBlock], br[kMaxRowBlock];
            row_to_float(a, ar, n);
            row_to_float(b, br, n);
            for (int64_t j = 0; j < n; ++j) state[j] = ar[j] * state[j] + br[j];
            row_from_float(state, h, n);
        } else {
            for (int64_t j = 0; j < n; ++j) {
                const M s = load<T, M>(a, j, sa) * state[j] + load<T, M>(b, j, sb);
                state[j] = s;
                store<T, M>(h, j, sh, s);
            }
        }
    }

    template <typename T, typename M, bool Contig, typename HP>
    static void adjoint(const T* __restrict__ a, const HP* __restrict__ h_prev, const T* __restrict__ dh,
                        T* __restrict__ da, T* __restrict__ db, M* __restrict__ grad, int64_t n, int64_t sa, int64_t sh,
                        int64_t sg, int64_t sda, int64_t sdb) {
        if constexpr (vectorised<T, Contig>) {
            vector_adjoint(a, h_prev, dh, da, db, grad, n);
        } else if constexpr (Contig && std::is_same_v<T, float16> && std::is_same_v<HP, T>) {
            float ar[kMaxRowBlock], hr[kMaxRowBlock], gr[kMaxRowBlock];
            row_to_float(a, ar, n);
            row_to_float(h_prev, hr, n);
            row_to_float(dh, gr, n);
            for (int64_t j = 0; j < n; ++j) {
                const float g = grad[j] + gr[j];
                gr[j] = g;          // grad_b, in place
                hr[j] = hr[j] * g;  // grad_a, in place
                grad[j] = ar[j] * g;
            }
            row_from_float(hr, da, n);
            row_from_float(gr, db, n);
        } else {
            for (int64_t j = 0; j < n; ++j) {
                const M g = grad[j] + load<T, M>(dh, j, sg);
                store<T, M>(db, j, sdb, g);
                store<T, M>(da, j, sda, load<HP, M>(h_prev, j, sh) * g);
                grad[j] = load<T, M>(a, j, sa) * g;
            }
        }
    }
};

template <>
struct Kernels<LinearScanForwardParams, LinearScanBackwardParams> : ScanKernels<LinearScan> {
    static constexpr const char* rows = kRowsName;
};

template const KernelTable<LinearScanForwardParams, LinearScanBackwardParams>&
kernel_table<LinearScanForwardParams, LinearScanBackwardParams>();

}  // namespace qrnn::cpu::QRNN_ISA
