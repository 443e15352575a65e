// linear_scan: h[t] = a[t] * h[t-1] + b[t], h[-1] = h0 (zeros when absent): the diagonal
// first-order recurrence of RG-LRU, LRU, HGRN, Mamba-style scans and minGRU in decay form.
//
// Unlike ForgetMult (h = f x + (1 - f) h), the decay `a` and the input `b` are separate
// arrays, so a decay close to 1 (long memory) is represented exactly. Every array is
// addressed as [time][batch][hidden] through element strides: time-major, batch-first and
// reversed-in-time layouts (a negative time stride: the scan runs from the last step) all
// run through one kernel. No torch, no Python: raw pointers, sizes and strides only; the
// caller owns (and allocates) every buffer.
#pragma once

#include <cstdint>

#include "qrnn/dtype.hpp"
#include "qrnn/view.hpp"

namespace qrnn {

struct LinearScanForwardParams {
    int64_t seq_len = 0, batch = 0, hidden = 0;
    DType dtype = DType::float32;     // of a, b and h
    ConstView3 a, b;
    ConstView2 h0;                    // optional
    DType h0_dtype = DType::float32;  // dtype, or float32 when dtype is 16-bit (a float32 carried state)
    // Which steps are real (as for every family, qrnn/view.hpp): optional
    const int64_t* lengths = nullptr;     // valid steps per batch row (dense), 0..seq_len
    int64_t lengths_stride = 1;
    const int64_t* cu_seqlens = nullptr;  // packed: batch + 1 offsets into the one row
    bool reverse = false;                 // each sequence from its last real step back
    View3 h;                              // output, every element written
};

// The backward needs the decays and the forward output (h[t-1] for grad_a), not b.
struct LinearScanBackwardParams {
    int64_t seq_len = 0, batch = 0, hidden = 0;
    DType dtype = DType::float32;     // of a, h, grad_h, grad_a, grad_b
    ConstView3 a;
    ConstView3 h;                     // the forward output
    ConstView2 h0;                    // optional, as in the forward pass
    DType h0_dtype = DType::float32;  // of h0 and grad_h0
    // Which steps are real (as for every family, qrnn/view.hpp): optional
    const int64_t* lengths = nullptr;     // valid steps per batch row (dense), 0..seq_len
    int64_t lengths_stride = 1;
    const int64_t* cu_seqlens = nullptr;  // packed: batch + 1 offsets into the one row
    bool reverse = false;                 // each sequence from its last real step back
    ConstView3 grad_h;
    View3 grad_a, grad_b;                 // outputs, every element written
    View2 grad_h0;                        // optional output
};

namespace cpu {

// General strided entry points. `num_threads` <= 0 means one thread per hardware core.
// Invalid sizes, strides or dtypes throw std::invalid_argument naming the argument.
QRNN_API void linear_scan_forward(const LinearScanForwardParams& params, int num_threads = 0);
QRNN_API void linear_scan_backward(const LinearScanBackwardParams& params, int num_threads = 0);

}  // namespace cpu
}  // namespace qrnn

// ---- The family's manifest -----------------------------------------------------------------
// Its kernels' argument lists, X(kind, field) in the order qrnn._C reads them (kinds:
// src/common/kernel_args.hpp), and its ops' schemas: Python defines the torch ops from
// these strings (qrnn._C exports them) and the C++ operator library registers the same.
#define QRNN_LINEAR_SCAN_FORWARD_FIELDS(X) \
    X(dtype, dtype)                        \
    X(integer, seq_len)                    \
    X(integer, batch)                      \
    X(integer, hidden)                     \
    X(cview3, a)                           \
    X(cview3, b)                           \
    X(cview2, h0)                          \
    X(dtype, h0_dtype)                     \
    X(lengths, lengths)                    \
    X(integer, lengths_stride)             \
    X(lengths, cu_seqlens)                 \
    X(flag, reverse)                       \
    X(view3, h)

#define QRNN_LINEAR_SCAN_BACKWARD_FIELDS(X) \
    X(dtype, dtype)                         \
    X(integer, seq_len)                     \
    X(integer, batch)                       \
    X(integer, hidden)                      \
    X(cview3, a)                            \
    X(cview3, h)                            \
    X(cview2, h0)                           \
    X(dtype, h0_dtype)                      \
    X(lengths, lengths)                     \
    X(integer, lengths_stride)              \
    X(lengths, cu_seqlens)                  \
    X(flag, reverse)                        \
    X(cview3, grad_h)                       \
    X(view3, grad_a)                        \
    X(view3, grad_b)                        \
    X(view2, grad_h0)

#define QRNN_LINEAR_SCAN_KERNELS(L)                                                  \
    L(linear_scan_forward, LinearScanForwardParams, QRNN_LINEAR_SCAN_FORWARD_FIELDS) \
    L(linear_scan_backward, LinearScanBackwardParams, QRNN_LINEAR_SCAN_BACKWARD_FIELDS)

// S(name, schema): the qrnn:: ops, forward first.
#define QRNN_LINEAR_SCAN_SCHEMAS(S)                                                        \
    S(linear_scan,                                                                         \
      "linear_scan(Tensor a, Tensor b, Tensor? h0, bool reverse, bool batch_first, "       \
      "Tensor? lengths=None, Tensor? cu_seqlens=None) -> Tensor")                          \
    S(linear_scan_backward,                                                                \
      "linear_scan_backward(Tensor grad_h, Tensor a, Tensor h, Tensor? h0, bool reverse, " \
      "bool batch_first, Tensor? lengths=None, Tensor? cu_seqlens=None) -> (Tensor, Tensor, Tensor)")
