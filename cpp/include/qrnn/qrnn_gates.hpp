// Fused QRNN pointwise step: from the gate pre-activations G that the layer's one GEMM
// produced, compute in a single pass over G
//
//   z = tanh(G_z), f = sigmoid(G_f) * keep * forget_scale, o = sigmoid(G_o)
//   c[t] = f * z + (1 - f) * c[t-1]            (c[-1] = c0, zeros when absent)
//   output[t] = o * c[t]    (output_gate)  or  c[t]  (no output gate)
//
// i.e. the activations, ForgetMult (the original pytorch-qrnn convention: f weights
// the new candidate) and the output gate. Math and the carried state are float32
// (float64 for float64 storage).
//
// Layout. Every array is addressed as [time][batch][hidden] through element strides,
// so time-major and batch-first run through one kernel. G holds 3 gate blocks (Z, F,
// O) or 2 (Z, F; no output gate) per (time, batch) row, `gate_stride` elements apart:
// G_z[t][b][j] = gates[t*stride_t + b*stride_b + j*stride_h], G_f adds gate_stride,
// G_o adds 2*gate_stride. The GEMM output (time, batch, 3*hidden) is read in place with
// gate_stride = hidden; the backward writes grad_gates in the same form, ready for the
// GEMM's backward.
//
// Variable lengths. With `lengths`, sequence b has lengths[b] valid steps (0 ..
// seq_len); steps at or after its end are padding: their output (and saved state and
// gate gradients) are written as zeros, and c_n is the state after its last valid step
// (c0 when it has none). `reverse` runs each sequence from its own last valid step
// back to step 0 (the reverse direction of a bidirectional layer), without any copy.
//
// Zoneout. `forget_mask` (optional, the storage dtype) multiplies sigmoid(G_f)
// element-wise: an unscaled 0/1 keep mask in training. `forget_scale` multiplies it
// too: 1 - p at evaluation. Pass the same mask and scale to the backward.
//
// No torch, no Python: raw pointers, sizes and strides; the caller owns every buffer.
#pragma once

#include <cstdint>

#include "qrnn/dtype.hpp"
#include "qrnn/view.hpp"

namespace qrnn {

// Fields shared with every family (QRNN_SIZE_PARAMS, QRNN_SEQUENCE_PARAMS): qrnn/view.hpp.
struct QrnnGatesForwardParams {
    QRNN_SIZE_PARAMS                   // dtype: storage of gates, forget_mask, output, states
    bool output_gate = true;           // G has an O block; output = o * c (else output = c)
    ConstView3 gates;                  // pre-activations, see the layout above
    int64_t gate_stride = 0;           // elements from a Z element to its F (and F to O)
    ConstView3 forget_mask;            // optional zoneout keep mask over (t, b, j)
    double forget_scale = 1.0;         // multiplies f (evaluation zoneout: 1 - p)
    ConstView2 c0;                     // optional initial state (batch, hidden)
    DType c0_dtype = DType::float32;   // dtype, or float32 when dtype is 16-bit
    QRNN_SEQUENCE_PARAMS               // reverse: walk each sequence from its end back to step 0
    View3 output;                      // every element written (padding steps as 0)
    View3 states;                      // optional: c[t] for every step, what the backward reads
                                       // (needed when output_gate; otherwise pass output there)
    View2 c_n;                         // optional final state (batch, hidden)
    DType c_n_dtype = DType::float32;  // dtype, or float32 when dtype is 16-bit
};

struct QrnnGatesBackwardParams {
    QRNN_SIZE_PARAMS                   // dtype: storage of gates, forget_mask, states, grad_output, grad_gates
    bool output_gate = true;
    ConstView3 gates;                  // the forward's pre-activations (activations are recomputed)
    int64_t gate_stride = 0;
    ConstView3 forget_mask;            // as in the forward pass
    double forget_scale = 1.0;
    ConstView2 c0;                     // as in the forward pass
    DType c0_dtype = DType::float32;   // of c0 and grad_c0
    QRNN_SEQUENCE_PARAMS
    ConstView3 states;                 // the forward's c[t] (its `states`, or its `output` without output gate)
    ConstView3 grad_output;            // optional (absent: zeros)
    ConstView2 grad_c_n;               // optional (absent: zeros)
    DType c_n_dtype = DType::float32;  // of grad_c_n
    View3 grad_gates;                  // every element written (padding steps as 0), G's form
    int64_t grad_gate_stride = 0;
    View2 grad_c0;                     // optional output, c0_dtype
};

}  // namespace qrnn

// ---- The family's manifest -----------------------------------------------------------------
// Its kernels' argument lists, X(kind, field) in the order qrnn._C reads them (kinds:
// src/common/kernel_args.hpp), and its ops' schemas: Python defines the torch ops from
// these strings (qrnn._C exports them) and the C++ operator library registers the same.
// The fields both fused-gate directions start with.
#define QRNN_GATES_COMMON_FIELDS(X) \
    X(real, forget_scale)           \
    QRNN_SIZE_FIELDS(X)             \
    X(flag, output_gate)            \
    X(cview3, gates)                \
    X(integer, gate_stride)         \
    X(cview3, forget_mask)          \
    X(cview2, c0)                   \
    X(dtype, c0_dtype)              \
    QRNN_SEQUENCE_FIELDS(X)

#define QRNN_GATES_FORWARD_FIELDS(X) \
    QRNN_GATES_COMMON_FIELDS(X)      \
    X(view3, output)                 \
    X(view3, states)                 \
    X(view2, c_n)                    \
    X(dtype, c_n_dtype)

#define QRNN_GATES_BACKWARD_FIELDS(X) \
    QRNN_GATES_COMMON_FIELDS(X)       \
    X(cview3, states)                 \
    X(cview3, grad_output)            \
    X(cview2, grad_c_n)               \
    X(dtype, c_n_dtype)               \
    X(view3, grad_gates)              \
    X(integer, grad_gate_stride)      \
    X(view2, grad_c0)

#define QRNN_QRNN_GATES_KERNELS(L)                                           \
    L(qrnn_gates_forward, QrnnGatesForwardParams, QRNN_GATES_FORWARD_FIELDS) \
    L(qrnn_gates_backward, QrnnGatesBackwardParams, QRNN_GATES_BACKWARD_FIELDS)

// S(name, schema): the qrnn:: ops, forward first.
#define QRNN_QRNN_GATES_SCHEMAS(S)                                                                              \
    S(qrnn_gates,                                                                                               \
      "qrnn_gates(Tensor gates, Tensor? c0, Tensor? forget_mask, Tensor? lengths, float forget_scale, "         \
      "bool output_gate, bool batch_first, bool reverse, Tensor? cu_seqlens=None) -> (Tensor, Tensor, Tensor)") \
    S(qrnn_gates_backward,                                                                                      \
      "qrnn_gates_backward(Tensor? grad_output, Tensor? grad_c_n, Tensor gates, Tensor states, "                \
      "Tensor? c0, Tensor? forget_mask, Tensor? lengths, float forget_scale, bool output_gate, "                \
      "bool batch_first, bool reverse, Tensor? cu_seqlens=None) -> (Tensor, Tensor)")

// The CPU entry points qrnn_gates_forward and qrnn_gates_backward(params, num_threads)
// (qrnn/view.hpp, QRNN_CPU_ENTRY_POINTS).
QRNN_CPU_ENTRY_POINTS(QRNN_QRNN_GATES_KERNELS)
