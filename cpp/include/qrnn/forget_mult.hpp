// ForgetMult: h[t] = f[t] * x[t] + (1 - f[t]) * h[t-1], h[-1] = h0 (zeros when absent).
//
// The convention is the original pytorch-qrnn one (f weights the new candidate x).
// Every array is addressed as [time][batch][hidden] through element strides, so
// time-major, batch-first and reversed-in-time layouts all run through one kernel
// (a reversed view is a negative time stride). No torch, no Python: raw pointers,
// sizes and strides only; the caller owns (and allocates) every buffer.
#pragma once

#include <cstdint>

#include "qrnn/dtype.hpp"
#include "qrnn/view.hpp"

namespace qrnn {

// Fields shared with every family (QRNN_SIZE_PARAMS, QRNN_SCAN_STATE_PARAMS): qrnn/view.hpp.
struct ForgetMultForwardParams {
    QRNN_SIZE_PARAMS  // dtype: of f, x and h
    ConstView3 f, x;
    QRNN_SCAN_STATE_PARAMS
    View3 h;  // output, every element written
};

struct ForgetMultBackwardParams {
    QRNN_SIZE_PARAMS  // dtype: of f, x, h, grad_h, grad_f, grad_x
    ConstView3 f, x;
    ConstView3 h;     // the forward output (h[t-1] is needed for grad_f)
    QRNN_SCAN_STATE_PARAMS
    ConstView3 grad_h;
    View3 grad_f, grad_x;  // outputs, every element written
    View2 grad_h0;         // optional output
};

namespace cpu {

// The general strided entry points forget_mult_forward and forget_mult_backward(params,
// num_threads) are declared from the manifest below (QRNN_CPU_ENTRY_POINTS, qrnn/view.hpp).

// Fixed minimal entry point: contiguous time-major float32 arrays of shape
// (seq_len, batch, hidden); h0 is (batch, hidden) or nullptr.
QRNN_API void forget_mult(const float* f, const float* x, const float* h0, float* h, int64_t seq_len, int64_t batch,
                          int64_t hidden);

// Its backward: grad_f, grad_x (seq_len, batch, hidden) and grad_h0 (batch, hidden,
// may be nullptr) from grad_h, given the forward inputs and output h.
QRNN_API void forget_mult_backward(const float* f, const float* x, const float* h0, const float* h, const float* grad_h,
                                   float* grad_f, float* grad_x, float* grad_h0, int64_t seq_len, int64_t batch,
                                   int64_t hidden);

// The instruction set the kernels dispatch to on this CPU: "avx512_bf16", "avx512", "avx2",
// "neon" or "generic".
QRNN_API const char* simd_level();

// What a family's contiguous rows run on at that level: the vector layer's name ("avx512",
// "avx2", "neon") or "generic" (plain loops, vectorised by the compiler as it can). family:
// "forget_mult", "qrnn_gates" or "linear_scan"; nullptr for another name.
QRNN_API const char* simd_rows(const char* family);

}  // namespace cpu
}  // namespace qrnn

// ---- The family's manifest -----------------------------------------------------------------
// Its kernels' argument lists, X(kind, field) in the order qrnn._C reads them (kinds:
// src/common/kernel_args.hpp), and its ops' schemas: Python defines the torch ops from
// these strings (qrnn._C exports them) and the C++ operator library registers the same.
#define QRNN_FORGET_MULT_FORWARD_FIELDS(X) \
    QRNN_SIZE_FIELDS(X)                    \
    X(cview3, f)                           \
    X(cview3, x)                           \
    QRNN_SCAN_STATE_FIELDS(X)              \
    X(view3, h)

#define QRNN_FORGET_MULT_BACKWARD_FIELDS(X) \
    QRNN_SIZE_FIELDS(X)                     \
    X(cview3, f)                            \
    X(cview3, x)                            \
    X(cview3, h)                            \
    QRNN_SCAN_STATE_FIELDS(X)               \
    X(cview3, grad_h)                       \
    X(view3, grad_f)                        \
    X(view3, grad_x)                        \
    X(view2, grad_h0)

#define QRNN_FORGET_MULT_KERNELS(L)                                                  \
    L(forget_mult_forward, ForgetMultForwardParams, QRNN_FORGET_MULT_FORWARD_FIELDS) \
    L(forget_mult_backward, ForgetMultBackwardParams, QRNN_FORGET_MULT_BACKWARD_FIELDS)

// S(name, schema): the qrnn:: ops, forward first.
#define QRNN_FORGET_MULT_SCHEMAS(S)                                                              \
    S(forget_mult,                                                                               \
      "forget_mult(Tensor f, Tensor x, Tensor? h0, bool batch_first, Tensor? lengths=None, "     \
      "Tensor? cu_seqlens=None, bool reverse=False) -> Tensor")                                  \
    S(forget_mult_backward,                                                                      \
      "forget_mult_backward(Tensor grad_h, Tensor f, Tensor x, Tensor h, Tensor? h0, "           \
      "bool batch_first, Tensor? lengths=None, Tensor? cu_seqlens=None, bool reverse=False) -> " \
      "(Tensor, Tensor, Tensor)")

QRNN_CPU_ENTRY_POINTS(QRNN_FORGET_MULT_KERNELS)
