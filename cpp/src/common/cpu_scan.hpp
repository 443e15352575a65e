// The CPU time loop of the diagonal first-order recurrences (ForgetMult, linear_scan),
// written once. Compiled per instruction set inside namespace QRNN_ISA, like the families'
// kernels that include it.
//
// A family is a policy struct:
//   using Forward = <forward params>;  using Backward = <backward params>;
//   template <typename T, typename M, bool Contig>
//   static void forward_row(const Forward&, int64_t t, const RowItem&, M* state);
//       advance the item's state by step t and store h[t]
//   template <typename T, typename M, bool Contig, typename HP>
//   static void backward_row(const Backward&, int64_t t, const RowItem&, const HP* h_prev, int64_t h_prev_stride,
//                            M* grad);
//       given grad = the gradient reaching h[t] from later steps, store step t's input
//       gradients and leave in grad the gradient reaching the previous step. h_prev is the
//       forward output's row at the previous step (HP = T), or before the sequence's first
//       step the initial state as M (HP = M, stride 1).
//   template <typename T, bool Contig>
//   static void pad_row(const Backward&, int64_t t, const RowItem&);
//       zero the input gradients of a padding step
//   static bool contiguous(const Forward&) / contiguous(const Backward&): every hidden stride 1
// Both params carry seq_len, batch, hidden; h0 / h0_dtype (the initial state, optional),
// the backward h (the forward output) and grad_h0 (optional output); and which steps of
// each row are real: lengths (dense rows), cu_seqlens (packed sequences) and reverse
// (common/cpu_kernel_common.hpp, describe_items). The rows' padding (a dense row's steps
// after its length) is written as zeros.
//
// Work is split into items = (sequence, block of hidden units), walked in chunks of
// consecutive items step by step together (common/cpu_work_items.hpp); an item keeps its
// state (or running gradient) in a float row.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/cpu_kernel_common.hpp"

namespace qrnn::cpu::QRNN_ISA {

template <typename Family, typename T, bool Contig>
void scan_forward_items(const typename Family::Forward& p, int64_t begin, int64_t end) {
    using M = typename math_type<T>::type;
    const ItemChunks chunks(p.hidden, begin, end);
    const int64_t block = chunks.block;
    RowItem* items = scratch<RowItem, 0>(size_t(chunks.most));
    M* states = scratch<M, 1>(size_t(chunks.most * block));
    for (int64_t first = begin; first < end; first += chunks.per_chunk) {
        const int64_t count = chunks.count(first, end);
        describe_items(p, block, first, count, items);
        for (int64_t i = 0; i < count; ++i)
            load_state(p.h0, p.h0_dtype, items[i].b, items[i].j0, items[i].n, &states[i * block]);
        const int64_t most = most_steps(items, count);
        for (int64_t k = 0; k < most; ++k)
            for (int64_t i = 0; i < count; ++i)
                if (k < items[i].steps)
                    Family::template forward_row<T, M, Contig>(p, step_time(k, items[i], p.reverse), items[i],
                                                               &states[i * block]);
        const int64_t sh = Contig ? 1 : p.h.stride_h;
        for (int64_t i = 0; i < count; ++i)
            if (pads(p, items[i]))
                for (int64_t t = items[i].steps; t < p.seq_len; ++t)
                    zero_row(row_at<T>(p.h, t, items[i]), items[i].n, sh);
    }
}

// Walks each item's steps backwards with a running gradient; the gradient left after its
// first step is grad_h0 (zeros for an empty sequence).
template <typename Family, typename T, bool Contig>
void scan_backward_items(const typename Family::Backward& p, int64_t begin, int64_t end) {
    using M = typename math_type<T>::type;
    const ItemChunks chunks(p.hidden, begin, end);
    const int64_t block = chunks.block;
    const int64_t sh = Contig ? 1 : p.h.stride_h;
    RowItem* items = scratch<RowItem, 0>(size_t(chunks.most));
    M* grads = scratch<M, 1>(size_t(chunks.most * block));
    M h0[kMaxRowBlock];
    for (int64_t first = begin; first < end; first += chunks.per_chunk) {
        const int64_t count = chunks.count(first, end);
        describe_items(p, block, first, count, items);
        std::fill(grads, grads + count * block, M(0));
        for (int64_t i = 0; i < count; ++i)
            if (pads(p, items[i]))
                for (int64_t t = items[i].steps; t < p.seq_len; ++t)
                    Family::template pad_row<T, Contig>(p, t, items[i]);
        for (int64_t k = most_steps(items, count) - 1; k >= 0; --k) {
            for (int64_t i = 0; i < count; ++i) {
                const RowItem& it = items[i];
                if (k >= it.steps) continue;
                const int64_t t = step_time(k, it, p.reverse);
                if (k == 0) {  // the step before the first is h0 (zeros when absent)
                    load_state(p.h0, p.h0_dtype, it.b, it.j0, it.n, h0);
                    Family::template backward_row<T, M, Contig, M>(p, t, it, h0, 1, &grads[i * block]);
                } else {
                    Family::template backward_row<T, M, Contig, T>(
                        p, t, it, row_at<T>(p.h, step_time(k - 1, it, p.reverse), it), sh, &grads[i * block]);
                }
            }
        }
        if (p.grad_h0.data)
            for (int64_t i = 0; i < count; ++i)
                store_state(p.grad_h0, p.h0_dtype, items[i].b, items[i].j0, items[i].n, &grads[i * block]);
    }
}

// The instruction set's table entries of a scan family: the contiguous or the strided loop.
template <typename Family>
struct ScanKernels {
    template <typename T>
    static void forward(const typename Family::Forward& p, int64_t begin, int64_t end) {
        Family::contiguous(p) ? scan_forward_items<Family, T, true>(p, begin, end)
                              : scan_forward_items<Family, T, false>(p, begin, end);
    }
    template <typename T>
    static void backward(const typename Family::Backward& p, int64_t begin, int64_t end) {
        Family::contiguous(p) ? scan_backward_items<Family, T, true>(p, begin, end)
                              : scan_backward_items<Family, T, false>(p, begin, end);
    }
};

}  // namespace qrnn::cpu::QRNN_ISA
