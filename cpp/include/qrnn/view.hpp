// Strided views over caller-owned arrays, shared by every kernel's parameter struct.
// Strides are in elements (not bytes) and may be zero or negative; `data == nullptr`
// marks an optional array as absent.
//
// Sequences. Every family's parameters say which steps of the (time, batch, hidden)
// arrays are real with the same fields:
//   lengths, lengths_stride  dense rows: row b has lengths[b] real steps (0..seq_len);
//                            its later steps are padding, written as zeros
//   cu_seqlens               packed sequences (flash-linear-attention's layout): the
//                            arrays have one batch row of seq_len steps holding `batch`
//                            sequences end to end, sequence b being steps
//                            [cu_seqlens[b], cu_seqlens[b + 1]) (batch + 1 offsets from 0
//                            to seq_len, nondecreasing); the states (initial, final and
//                            their gradients) have one row per sequence
//   reverse                  each sequence runs from its last real step back to its first
// (without lengths or cu_seqlens a whole row reversed is also a negative time stride).
#pragma once

#include <cstdint>

#include "qrnn/dtype.hpp"

namespace qrnn {

struct ConstView3 {
    const void* data = nullptr;
    int64_t stride_t = 0, stride_b = 0, stride_h = 0;
};
struct View3 {
    void* data = nullptr;
    int64_t stride_t = 0, stride_b = 0, stride_h = 0;
};
struct ConstView2 {
    const void* data = nullptr;
    int64_t stride_b = 0, stride_h = 0;
};
struct View2 {
    void* data = nullptr;
    int64_t stride_b = 0, stride_h = 0;
};

}  // namespace qrnn

// ---- The fields every family's parameter structs share, written once ------------------------
// Each is declared by a macro in the structs (same names, order and defaults in every struct)
// and listed by its twin in the manifests' field lists, X(kind, field) (qrnn/<family>.hpp).

// The sizes and the storage dtype: the first fields of every struct.
#define QRNN_SIZE_PARAMS                        \
    int64_t seq_len = 0, batch = 0, hidden = 0; \
    DType dtype = DType::float32;
#define QRNN_SIZE_FIELDS(X) \
    X(dtype, dtype)         \
    X(integer, seq_len)     \
    X(integer, batch)       \
    X(integer, hidden)

// Which steps are real ("Sequences" above): optional.
#define QRNN_SEQUENCE_PARAMS                                                                 \
    const int64_t* lengths = nullptr;    /* valid steps per batch row (dense), 0..seq_len */ \
    int64_t lengths_stride = 1;                                                              \
    const int64_t* cu_seqlens = nullptr; /* packed: batch + 1 offsets into the one row */    \
    bool reverse = false;                /* each sequence from its last real step back */
#define QRNN_SEQUENCE_FIELDS(X) \
    X(lengths, lengths)         \
    X(integer, lengths_stride)  \
    X(lengths, cu_seqlens)      \
    X(flag, reverse)

// The scan families' (h = a h + b forms: ForgetMult, linear_scan) initial state and sequences,
// between their inputs and their outputs.
#define QRNN_SCAN_STATE_PARAMS                                                                              \
    ConstView2 h0;                   /* optional; grad_h0 of a backward has its rows and h0_dtype */        \
    DType h0_dtype = DType::float32; /* dtype, or float32 when dtype is 16-bit (a float32 carried state) */ \
    QRNN_SEQUENCE_PARAMS
#define QRNN_SCAN_STATE_FIELDS(X) \
    X(cview2, h0)                 \
    X(dtype, h0_dtype)            \
    QRNN_SEQUENCE_FIELDS(X)

// A family's CPU entry points, declared from its manifest's kernel list KERNELS (L(kernel,
// Params, FIELDS) per kernel, qrnn/<family>.hpp), each
//   QRNN_API void qrnn::cpu::<kernel>(const Params& params, int num_threads = 0);
// `num_threads` <= 0 means one thread per hardware core (Python passes
// torch.get_num_threads()); invalid sizes, strides, dtypes or lengths throw
// std::invalid_argument naming the field.
#define QRNN_CPU_ENTRY_POINT(kernel, Params, FIELDS) QRNN_API void kernel(const Params& params, int num_threads = 0);
#define QRNN_CPU_ENTRY_POINTS(KERNELS) \
    namespace qrnn::cpu {              \
    KERNELS(QRNN_CPU_ENTRY_POINT)      \
    }
