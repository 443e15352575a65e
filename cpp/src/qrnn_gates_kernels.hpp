// Fused QRNN gate kernels (activations + ForgetMult + output gate), templated over the
// storage type and compiled once per instruction set inside namespace QRNN_ISA.
//
// Work is split into items = (batch row, block of hidden units), like ForgetMult. An
// item walks its sequence's valid steps serially (forwards, or backwards for
// `reverse`), keeping the state in a local float array; the loop over the block's
// hidden units is the vectorised one. Absent optional inputs (zoneout mask, output
// gradient) are replaced by a local row of ones / zeros with time stride 0, so the hot
// loops have no per-element branches.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu_kernel_common.hpp"
#include "cpu_math.hpp"
#include "qrnn_gates_table.hpp"

#ifndef QRNN_ISA
#error "define QRNN_ISA before including qrnn_gates_kernels.hpp"
#endif

namespace qrnn::cpu::QRNN_ISA {

constexpr int64_t kGatesBlock = gates_max_block;

// Where an item's walk over time starts and which way it goes.
struct Walk {
    int64_t valid;  // valid steps of this sequence
    int64_t first;  // time index of the first step walked
    int64_t dir;    // +1 or -1: time index change per step
};

inline int64_t valid_steps(const int64_t* lengths, int64_t stride, int64_t b, int64_t seq_len) {
    return lengths ? lengths[b * stride] : seq_len;
}

// One step of the forward pass over n hidden units (S = 1 in the contiguous case).
template <typename T, typename M, bool OutputGate>
inline void forward_row(const T* __restrict__ gz, const T* __restrict__ gf, const T* __restrict__ go,
                        const T* __restrict__ keep, T* __restrict__ out, M* __restrict__ c, int64_t n,
                        int64_t sg, int64_t sk, int64_t so, M scale) {
    for (int64_t j = 0; j < n; ++j) {
        const M z = tanh(load<T, M>(gz, j, sg));
        const M f = sigmoid(load<T, M>(gf, j, sg)) * load<T, M>(keep, j, sk) * scale;
        const M cj = f * z + (M(1) - f) * c[j];
        c[j] = cj;
        const M h = OutputGate ? sigmoid(load<T, M>(go, j, sg)) * cj : cj;
        store<T, M>(out, j, so, h);
    }
}

template <typename T, typename M>
inline void store_row(T* __restrict__ dst, const M* __restrict__ src, int64_t n, int64_t s) {
    for (int64_t j = 0; j < n; ++j) store<T, M>(dst, j, s, src[j]);
}

template <typename T>
inline void zero_row(T* __restrict__ dst, int64_t n, int64_t s) {
    const T zero = from_float<T>(0.f);
    for (int64_t j = 0; j < n; ++j) dst[j * s] = zero;
}

template <typename T, bool Contig, bool OutputGate>
void gates_forward_items(const QrnnGatesForwardParams& p, int64_t begin, int64_t end) {
    using M = typename math_type<T>::type;
    const int64_t block = gates_block(p.hidden);
    const int64_t blocks = (p.hidden + block - 1) / block;
    const int64_t gs = p.gate_stride;
    const M scale = M(p.forget_scale);
    M c[kGatesBlock];
    T ones[kGatesBlock];
    std::fill(ones, ones + block, from_float<T>(1.f));
    const bool has_mask = p.forget_mask.data != nullptr;
    const int64_t sg = Contig ? 1 : p.gates.stride_h;
    const int64_t sk = Contig || !has_mask ? 1 : p.forget_mask.stride_h;
    const int64_t so = Contig ? 1 : p.output.stride_h;
    const int64_t ss = Contig ? 1 : p.states.stride_h;
    for (int64_t item = begin; item < end; ++item) {
        const int64_t b = item / blocks, j0 = (item % blocks) * block;
        const int64_t n = std::min(block, p.hidden - j0);
        const int64_t valid = valid_steps(p.lengths, p.lengths_stride, b, p.seq_len);
        load_state(p.c0, p.c0_dtype, b, j0, n, c);
        if (valid > 0) {
            const int64_t first = p.reverse ? valid - 1 : 0, dir = p.reverse ? -1 : 1;
            const T* g = at<T>(p.gates.data, first * p.gates.stride_t + b * p.gates.stride_b + j0 * p.gates.stride_h);
            const T* keep = has_mask ? at<T>(p.forget_mask.data, first * p.forget_mask.stride_t +
                                                                 b * p.forget_mask.stride_b + j0 * p.forget_mask.stride_h)
                                     : ones;
            T* out = at<T>(p.output.data, first * p.output.stride_t + b * p.output.stride_b + j0 * p.output.stride_h);
            T* st = p.states.data ? at<T>(p.states.data, first * p.states.stride_t + b * p.states.stride_b +
                                                         j0 * p.states.stride_h)
                                  : nullptr;
            const int64_t dg = dir * p.gates.stride_t, dk = has_mask ? dir * p.forget_mask.stride_t : 0,
                          dout = dir * p.output.stride_t, dst = dir * p.states.stride_t;
            for (int64_t k = 0; k < valid; ++k) {
                forward_row<T, M, OutputGate>(g, g + gs, g + 2 * gs, keep, out, c, n, sg, sk, so, scale);
                if (st) {
                    store_row<T, M>(st, c, n, ss);
                    st += dst;
                }
                g += dg;
                keep += dk;
                out += dout;
            }
        }
        if (p.c_n.data) store_state(p.c_n, p.c_n_dtype, b, j0, n, c);
        // Padding steps (at or after the sequence's end, either direction): zeros.
        for (int64_t t = valid; t < p.seq_len; ++t) {
            zero_row(at<T>(p.output.data, t * p.output.stride_t + b * p.output.stride_b + j0 * p.output.stride_h), n, so);
            if (p.states.data)
                zero_row(at<T>(p.states.data, t * p.states.stride_t + b * p.states.stride_b + j0 * p.states.stride_h),
                         n, ss);
        }
    }
}

// One step of the backward pass: g (the gradient reaching c[t]) gains the output's
// gradient, gives the gate gradients, and leaves as the gradient reaching c[t-1].
// c[t] is recomputed from c[t-1] rather than read.
template <typename T, typename M, typename C, bool OutputGate>
inline void backward_row(const T* __restrict__ gz, const T* __restrict__ gf, const T* __restrict__ go,
                         const T* __restrict__ keep, const C* __restrict__ cprev, const T* __restrict__ dh,
                         T* __restrict__ dz, T* __restrict__ df, T* __restrict__ dout, M* __restrict__ grad,
                         int64_t n, int64_t sg, int64_t sk, int64_t sc, int64_t sd, int64_t sdg, M scale) {
    for (int64_t j = 0; j < n; ++j) {
        const M z = tanh(load<T, M>(gz, j, sg));
        const M s = sigmoid(load<T, M>(gf, j, sg));
        const M kf = load<T, M>(keep, j, sk) * scale;
        const M f = s * kf;
        const M cp = M(to_math(cprev[j * sc]));
        const M dhv = load<T, M>(dh, j, sd);
        M g;
        if constexpr (OutputGate) {
            const M o = sigmoid(load<T, M>(go, j, sg));
            const M cj = f * z + (M(1) - f) * cp;
            g = grad[j] + dhv * o;
            store<T, M>(dout, j, sdg, dhv * cj * o * (M(1) - o));
        } else {
            g = grad[j] + dhv;
        }
        store<T, M>(dz, j, sdg, f * g * (M(1) - z * z));
        store<T, M>(df, j, sdg, (z - cp) * g * kf * s * (M(1) - s));
        grad[j] = g - f * g;
    }
}

template <typename T, bool Contig, bool OutputGate>
void gates_backward_items(const QrnnGatesBackwardParams& p, int64_t begin, int64_t end) {
    using M = typename math_type<T>::type;
    const int64_t block = gates_block(p.hidden);
    const int64_t blocks = (p.hidden + block - 1) / block;
    const int64_t gs = p.gate_stride, dgs = p.grad_gate_stride;
    const int n_gates = OutputGate ? 3 : 2;
    const M scale = M(p.forget_scale);
    M grad[kGatesBlock], c0[kGatesBlock];
    T ones[kGatesBlock], zeros[kGatesBlock];
    std::fill(ones, ones + block, from_float<T>(1.f));
    std::fill(zeros, zeros + block, from_float<T>(0.f));
    const bool has_mask = p.forget_mask.data != nullptr, has_dh = p.grad_output.data != nullptr;
    const int64_t sg = Contig ? 1 : p.gates.stride_h;
    const int64_t sk = Contig || !has_mask ? 1 : p.forget_mask.stride_h;
    const int64_t sc = Contig ? 1 : p.states.stride_h;
    const int64_t sd = Contig || !has_dh ? 1 : p.grad_output.stride_h;
    const int64_t sdg = Contig ? 1 : p.grad_gates.stride_h;
    for (int64_t item = begin; item < end; ++item) {
        const int64_t b = item / blocks, j0 = (item % blocks) * block;
        const int64_t n = std::min(block, p.hidden - j0);
        const int64_t valid = valid_steps(p.lengths, p.lengths_stride, b, p.seq_len);
        load_state(p.grad_c_n, p.c_n_dtype, b, j0, n, grad);
        load_state(p.c0, p.c0_dtype, b, j0, n, c0);
        for (int64_t t = valid; t < p.seq_len; ++t) {
            T* row = at<T>(p.grad_gates.data, t * p.grad_gates.stride_t + b * p.grad_gates.stride_b +
                                                  j0 * p.grad_gates.stride_h);
            for (int k = 0; k < n_gates; ++k) zero_row(row + k * dgs, n, sdg);
        }
        if (valid > 0) {
            // Walk the forward's steps in reverse: from its last step to its first.
            const int64_t last = p.reverse ? 0 : valid - 1, back = p.reverse ? 1 : -1;
            auto offset = [&](const auto& v, int64_t t) { return t * v.stride_t + b * v.stride_b + j0 * v.stride_h; };
            const T* g = at<T>(p.gates.data, offset(p.gates, last));
            const T* keep = has_mask ? at<T>(p.forget_mask.data, offset(p.forget_mask, last)) : ones;
            const T* dh = has_dh ? at<T>(p.grad_output.data, offset(p.grad_output, last)) : zeros;
            T* dg = at<T>(p.grad_gates.data, offset(p.grad_gates, last));
            const int64_t step_g = back * p.gates.stride_t, step_k = has_mask ? back * p.forget_mask.stride_t : 0,
                          step_d = has_dh ? back * p.grad_output.stride_t : 0, step_dg = back * p.grad_gates.stride_t;
            const T* cprev = valid > 1 ? at<T>(p.states.data, offset(p.states, last + back)) : nullptr;
            const int64_t step_c = back * p.states.stride_t;
            for (int64_t k = valid - 1; k >= 1; --k) {
                backward_row<T, M, T, OutputGate>(g, g + gs, g + 2 * gs, keep, cprev, dh, dg, dg + dgs, dg + 2 * dgs,
                                                  grad, n, sg, sk, sc, sd, sdg, scale);
                g += step_g;
                keep += step_k;
                dh += step_d;
                dg += step_dg;
                if (k > 1) cprev += step_c;
            }
            backward_row<T, M, M, OutputGate>(g, g + gs, g + 2 * gs, keep, c0, dh, dg, dg + dgs, dg + 2 * dgs, grad,
                                              n, sg, sk, 1, sd, sdg, scale);
        }
        if (p.grad_c0.data) store_state(p.grad_c0, p.c0_dtype, b, j0, n, grad);
    }
}

template <typename T>
void gates_forward(const QrnnGatesForwardParams& p, int64_t begin, int64_t end) {
    const bool contig = p.gates.stride_h == 1 && p.output.stride_h == 1 &&
                        (!p.forget_mask.data || p.forget_mask.stride_h == 1) &&
                        (!p.states.data || p.states.stride_h == 1);
    if (p.output_gate)
        contig ? gates_forward_items<T, true, true>(p, begin, end) : gates_forward_items<T, false, true>(p, begin, end);
    else
        contig ? gates_forward_items<T, true, false>(p, begin, end) : gates_forward_items<T, false, false>(p, begin, end);
}

template <typename T>
void gates_backward(const QrnnGatesBackwardParams& p, int64_t begin, int64_t end) {
    const bool contig = p.gates.stride_h == 1 && p.states.stride_h == 1 && p.grad_gates.stride_h == 1 &&
                        (!p.forget_mask.data || p.forget_mask.stride_h == 1) &&
                        (!p.grad_output.data || p.grad_output.stride_h == 1);
    if (p.output_gate)
        contig ? gates_backward_items<T, true, true>(p, begin, end) : gates_backward_items<T, false, true>(p, begin, end);
    else
        contig ? gates_backward_items<T, true, false>(p, begin, end) : gates_backward_items<T, false, false>(p, begin, end);
}

}  // namespace qrnn::cpu::QRNN_ISA
