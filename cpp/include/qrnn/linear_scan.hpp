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

// Fields shared with every family (QRNN_SIZE_PARAMS, QRNN_SCAN_STATE_PARAMS): qrnn/view.hpp.
struct LinearScanForwardParams {
    QRNN_SIZE_PARAMS  // dtype: of a, b and h
    ConstView3 a, b;
    QRNN_SCAN_STATE_PARAMS
    View3 h;  // output, every element written
};

// The backward needs the decays and the forward output (h[t-1] for grad_a), not b.
struct LinearScanBackwardParams {
    QRNN_SIZE_PARAMS  // dtype: of a, h, grad_h, grad_a, grad_b
    ConstView3 a;
    ConstView3 h;     // the forward output
    QRNN_SCAN_STATE_PARAMS
    ConstView3 grad_h;
    View3 grad_a, grad_b;  // outputs, every element written
    View2 grad_h0;         // optional output
};

}  // namespace qrnn

// ---- The family's manifest -----------------------------------------------------------------
// Its kernels' argument lists, X(kind, field) in the order qrnn._C reads them (kinds:
// src/common/kernel_args.hpp), and its ops' schemas: Python defines the torch ops from
// these strings (qrnn._C exports them) and the C++ operator library registers the same.
#define QRNN_LINEAR_SCAN_FORWARD_FIELDS(X) \
    QRNN_SIZE_FIELDS(X)                    \
    X(cview3, a)                           \
    X(cview3, b)                           \
    QRNN_SCAN_STATE_FIELDS(X)              \
    X(view3, h)

#define QRNN_LINEAR_SCAN_BACKWARD_FIELDS(X) \
    QRNN_SIZE_FIELDS(X)                     \
    X(cview3, a)                            \
    X(cview3, h)                            \
    QRNN_SCAN_STATE_FIELDS(X)               \
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

// The CPU entry points linear_scan_forward and linear_scan_backward(params, num_threads), any
// strides (qrnn/view.hpp, QRNN_CPU_ENTRY_POINTS).
QRNN_CPU_ENTRY_POINTS(QRNN_LINEAR_SCAN_KERNELS)
