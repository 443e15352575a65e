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

struct ForgetMultForwardParams {
    int64_t seq_len = 0, batch = 0, hidden = 0;
    DType dtype = DType::float32;     // of f, x and h
    ConstView3 f, x;
    ConstView2 h0;                    // optional
    DType h0_dtype = DType::float32;  // dtype, or float32 when dtype is 16-bit (a float32 carried state)
    // Which steps are real (as for every family, qrnn/view.hpp): optional
    const int64_t* lengths = nullptr;     // valid steps per batch row (dense), 0..seq_len
    int64_t lengths_stride = 1;
    const int64_t* cu_seqlens = nullptr;  // packed: batch + 1 offsets into the one row
    bool reverse = false;                 // each sequence from its last real step back
    View3 h;                              // output, every element written
};

struct ForgetMultBackwardParams {
    int64_t seq_len = 0, batch = 0, hidden = 0;
    DType dtype = DType::float32;     // of f, x, h, grad_h, grad_f, grad_x
    ConstView3 f, x;
    ConstView3 h;                     // the forward output (h[t-1] is needed for grad_f)
    ConstView2 h0;                    // optional, as in the forward pass
    DType h0_dtype = DType::float32;  // of h0 and grad_h0
    // Which steps are real (as for every family, qrnn/view.hpp): optional
    const int64_t* lengths = nullptr;     // valid steps per batch row (dense), 0..seq_len
    int64_t lengths_stride = 1;
    const int64_t* cu_seqlens = nullptr;  // packed: batch + 1 offsets into the one row
    bool reverse = false;                 // each sequence from its last real step back
    ConstView3 grad_h;
    View3 grad_f, grad_x;                 // outputs, every element written
    View2 grad_h0;                        // optional output
};

namespace cpu {

// General strided entry points. `num_threads` <= 0 means one thread per hardware core;
// Python passes torch.get_num_threads(). Invalid sizes, strides or dtypes throw
// std::invalid_argument.
QRNN_API void forget_mult_forward(const ForgetMultForwardParams& params, int num_threads = 0);
QRNN_API void forget_mult_backward(const ForgetMultBackwardParams& params, int num_threads = 0);

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
// The fields both kernels start with.
#define QRNN_FORGET_MULT_COMMON_FIELDS(X) \
    X(dtype, dtype)                       \
    X(integer, seq_len)                   \
    X(integer, batch)                     \
    X(integer, hidden)                    \
    X(cview3, f)                          \
    X(cview3, x)

#define QRNN_FORGET_MULT_FORWARD_FIELDS(X) \
    QRNN_FORGET_MULT_COMMON_FIELDS(X)      \
    X(cview2, h0)                          \
    X(dtype, h0_dtype)                     \
    X(lengths, lengths)                    \
    X(integer, lengths_stride)             \
    X(lengths, cu_seqlens)                 \
    X(flag, reverse)                       \
    X(view3, h)

#define QRNN_FORGET_MULT_BACKWARD_FIELDS(X) \
    QRNN_FORGET_MULT_COMMON_FIELDS(X)       \
    X(cview3, h)                            \
    X(cview2, h0)                           \
    X(dtype, h0_dtype)                      \
    X(lengths, lengths)                     \
    X(integer, lengths_stride)              \
    X(lengths, cu_seqlens)                  \
    X(flag, reverse)                        \
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
